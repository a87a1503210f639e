package nn

import (
	"fmt"
	"math"
)

func float32NaN() float32 { return float32(math.NaN()) }

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
