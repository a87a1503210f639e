//go:build tools

// Package tools pins the versions of build-time tools (the avo assembly
// generator) in go.mod. It is never compiled into spargo.
package tools

import (
	_ "github.com/mmcloughlin/avo/build"
)
