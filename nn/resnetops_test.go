package nn

import (
	"fmt"
	"strings"
	"testing"
)

func TestResNetOpsErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		m    Module
		in   []int
		msg  string
	}{
		{"adaptive-3d", AdaptiveAvgPool2d{OutH: 1, OutW: 1}, []int{2, 3, 4}, "want [N C H W]"},
		{"adaptive-zero-out", AdaptiveAvgPool2d{OutH: 0, OutW: 1}, []int{1, 1, 2, 2}, "positive output size"},
		{"subsample-2d", SubsamplePad{Stride: 2}, []int{4, 5}, "want [N C H W]"},
		{"subsample-negative", SubsamplePad{Stride: 2, Before: -1}, []int{1, 1, 2, 2}, "non-negative"},
	} {
		tape := NewTape()
		y := c.m.Forward(tape.Const(NewTensor(c.in...)))
		if err := tape.Err(); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: error %v, want one with %q", c.name, err, c.msg)
		}
		if y == nil {
			t.Errorf("%s: nil result", c.name)
		}
	}
}

// The option-A shortcut of a CIFAR ResNet's 16 → 32 channel block: every other pixel,
// 8 zero channels on each side.
func ExampleSubsamplePad() {
	tape := NewTape()
	x := tape.Const(NewTensor(2, 16, 32, 32))
	y := SubsamplePad{Stride: 2, Before: 8, After: 8}.Forward(x)
	fmt.Println(y.Shape())
	// Output: [2 32 16 16]
}

// The global average pool that ends a ResNet: [N, C, H, W] → [N, C, 1, 1].
func ExampleAdaptiveAvgPool2d() {
	tape := NewTape()
	x, _ := FromSlice([]float32{1, 2, 3, 4, 5, 6}, 1, 1, 2, 3)
	fmt.Println(AdaptiveAvgPool2d{OutH: 1, OutW: 1}.Forward(tape.Const(x)).Value.Data)
	fmt.Println(AdaptiveAvgPool2d{OutH: 1, OutW: 2}.Forward(tape.Const(x)).Value.Data) // overlapping windows
	// Output:
	// [3.5]
	// [3 4]
}
