package hooks

import (
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
)

var allReduceAlgorithms = map[string]comm.Algorithm{
	"auto":               comm.Auto,
	"ring":               comm.Ring,
	"rabenseifner":       comm.Rabenseifner,
	"recursive_doubling": comm.RecursiveDoubling,
}

func init() {
	Register(Spec{
		Name:    "allreduce",
		Summary: "dense average of each bucket with an all-reduce (PyTorch DDP's default)",
		Options: []Option{{Name: "algorithm", Default: "auto",
			Help: "auto|ring|rabenseifner|recursive_doubling (auto: recursive doubling up to 2 KiB, then Rabenseifner for power-of-two P, else ring)"}},
		New: func(o Values) (ddp.CommHook, error) {
			a, err := o.Enum("algorithm", "auto", "ring", "rabenseifner", "recursive_doubling")
			if err != nil {
				return nil, err
			}
			return &ddp.AllReduceHook{Algorithm: allReduceAlgorithms[a]}, nil // a pointer: ddp.New can tell a shared instance
		},
	})
}
