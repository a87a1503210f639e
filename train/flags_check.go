package train

import "fmt"

// IntFlag is an integer flag's name and value, for AtLeast.
type IntFlag struct {
	Name  string
	Value int
}

// Int is the flag name (with its dash) with value v.
func Int(name string, v int) IntFlag { return IntFlag{Name: name, Value: v} }

// AtLeast refuses the first of flags whose value is below min, with an error naming the flag
// and its value: a program's flag check calls it before any work, so that -steps -1 or
// -epochs 0 is an error rather than "all" or a run of nothing.
//
//	err := train.AtLeast(1, train.Int("-batch", c.Batch), train.Int("-epochs", c.Epochs))
//	err = train.AtLeast(0, train.Int("-steps", c.Steps)) // 0: whole epochs
func AtLeast(min int, flags ...IntFlag) error {
	for _, f := range flags {
		if f.Value >= min {
			continue
		}
		if min == 0 {
			return fmt.Errorf("%s %d: want 0 or more", f.Name, f.Value)
		}
		return fmt.Errorf("%s %d: want at least %d", f.Name, f.Value, min)
	}
	return nil
}
