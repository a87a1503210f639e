package nn

import "strconv"

// Sequential runs its children in order. Children added with Append are named "0",
// "1", … like PyTorch's nn.Sequential; Add gives a name of your choice.
type Sequential struct {
	children []Child
}

var _ Container = (*Sequential)(nil)

// NewSequential returns a Sequential of the given modules named by position.
func NewSequential(mods ...Module) *Sequential {
	s := &Sequential{}
	for _, m := range mods {
		s.Append(m)
	}
	return s
}

// Append adds m named by its position.
func (s *Sequential) Append(m Module) *Sequential {
	return s.Add(strconv.Itoa(len(s.children)), m)
}

// Add adds m under a name.
func (s *Sequential) Add(name string, m Module) *Sequential {
	s.children = append(s.children, Child{Name: name, Module: m})
	return s
}

// Len returns the number of children.
func (s *Sequential) Len() int { return len(s.children) }

// Replace puts m in place of child i, under the same name (SetChannelsLast, for
// instance, replaces value-type layers).
func (s *Sequential) Replace(i int, m Module) { s.children[i].Module = m }

// Children returns the named children in order.
func (s *Sequential) Children() []Child { return s.children }

// Forward runs the children in order.
func (s *Sequential) Forward(x *Var) *Var {
	for _, c := range s.children {
		x = c.Module.Forward(x)
	}
	return x
}
