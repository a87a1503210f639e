#!/usr/bin/env bash
# Checks the package floors of docs/ARCHITECTURE.md: every package of the module imports only
# packages on a lower floor, or an internal package below its own directory. A package the
# table does not place is an error too (add it to the table here and in the document).
#
#   scripts/floors.sh            # prints nothing and exits 0 when the layout holds
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)

# floor PKG prints the floor of a package path relative to the module root ("" for the root).
floor() {
	case "$1" in
	internal/kernels | internal/golden | safetensors | plot | datasets | spec | comm) echo 0 ;;
	nn | comm/simnet | cluster) echo 1 ;;
	optim | models | ddp | nn/gorgonia) echo 2 ;;
	hooks | checkpoint | gradrec | models/internal/parity) echo 3 ;;
	train | models/internal/parity/export) echo 4 ;;
	cmd/spargo | cmd/spargo/* | examples/* | scripts/*) echo 5 ;;
	*) echo "" ;;
	esac
}

status=0
while read -r pkg imports; do
	rel=${pkg#"$mod"}
	rel=${rel#/}
	f=$(floor "$rel")
	if [ -z "$f" ]; then
		echo "$rel: not in the floor table (scripts/floors.sh, docs/ARCHITECTURE.md)"
		status=1
		continue
	fi
	for imp in $imports; do
		case "$imp" in "$mod"/*) ;; *) continue ;; esac
		irel=${imp#"$mod"/}
		fi=$(floor "$irel")
		case "$irel" in
		"$rel"/internal/* | "$(dirname "$rel")"/internal/*) [ "${fi:-$f}" -le "$f" ] && continue ;;
		esac
		if [ -z "$fi" ] || [ "$fi" -ge "$f" ]; then
			echo "$rel (floor $f) imports $irel (floor ${fi:-unplaced})"
			status=1
		fi
	done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./...)
exit $status
