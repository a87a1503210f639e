package kernels

import (
	"reflect"
	"slices"
	"testing"
)

// optionalVecOps are the vector-table entries a table may leave nil: every caller
// checks them and falls back to Go loops or per-plane calls (their comments in
// vecOps say which).
var optionalVecOps = []string{"gather32", "transpose16", "transpose8", "pack8", "pack6", "packT6", "bnPlanes"}

// Every implementation compiled into the binary, also those this CPU cannot run,
// fills every other entry of its vector table and of its channels-last BatchNorm
// table. A missing entry would fail only on the machines that pick that table (a
// channels-last max-pool without an AVX-512 entry crashed every AVX-512 CPU and
// none of the AVX2 machines that tested it), so this checks the tables themselves.
func TestImplTablesComplete(t *testing.T) {
	for name, p := range implTable {
		if p.kernel == nil || p.vec == nil || p.half == nil || p.mr <= 0 || p.nr <= 0 {
			t.Errorf("%s: micro-kernel, vector or half table missing", name)
			continue
		}
		for _, miss := range nilFuncFields(p.vec) {
			if !slices.Contains(optionalVecOps, miss) {
				t.Errorf("%s: vecOps.%s is nil", name, miss)
			}
		}
		if p.vec.bnNHWC == nil {
			continue // reported above
		}
		for _, miss := range nilFuncFields(p.vec.bnNHWC) {
			t.Errorf("%s: bnNHWCOps.%s is nil", name, miss)
		}
		if p.vec.bnPlanes != nil {
			for _, miss := range nilFuncFields(p.vec.bnPlanes) {
				t.Errorf("%s: bnPlanesOps.%s is nil", name, miss)
			}
		}
	}
}

// nilFuncFields lists the nil function and pointer fields of *s.
func nilFuncFields(s any) []string {
	v := reflect.ValueOf(s).Elem()
	var nils []string
	for i := range v.NumField() {
		if f := v.Field(i); (f.Kind() == reflect.Func || f.Kind() == reflect.Pointer) && f.IsNil() {
			nils = append(nils, v.Type().Field(i).Name)
		}
	}
	return nils
}
