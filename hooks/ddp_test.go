package hooks

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

func tinyNet(seed uint64) nn.Module {
	rng := nn.NewRand(seed)
	m := nn.NewSequential(
		nn.NewConv2d(3, 8, 3, 1, 1, true, rng), nn.ReLU{}, nn.MaxPool2d{Kernel: 2},
		nn.NewConv2d(8, 16, 3, 1, 1, true, rng), nn.ReLU{}, nn.AvgPool2d{Kernel: 2},
		nn.Flatten{}, nn.NewLinear(16*2*2, 32, true, rng), nn.ReLU{}, nn.NewLinear(32, 5, true, rng))
	nn.Parameters(m)
	return m
}

func paramHash(ps []*nn.Param) uint64 {
	h := fnv.New64a()
	for _, p := range ps {
		for _, v := range p.Value.Data {
			b := math.Float32bits(v)
			h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
		}
	}
	return h.Sum64()
}

// Replica consistency (docs/ALGORITHMS.md §0): after every step of a DDP training with several
// buckets (SparDL's default plan: one), all ranks hold bit-identical parameters, for every hook of this issue and P in
// {2, 3, 4, 5, 8} (gtopk: powers of two). The loss must also stay finite.
func TestReplicaConsistencyUnderDDP(t *testing.T) {
	const steps = 4
	specs := []string{"spardl:density=0.05,buckets=ddp", "spardl:density=0.05,teams=2,buckets=ddp", "spardl:density=0.05,teams=auto,buckets=ddp",
		"spardl:density=0.05,residual=partial,buckets=ddp", "topka:density=0.05", "topkdsa:density=0.05", "gtopk:density=0.05",
		"spardl:density=0.05,dense_warmup=2,buckets=ddp", "spardl:density=0.05", "spardl:density=0.05,teams=2",
		"oktopk:density=0.05,tau=2,tau_prime=3", "oktopk:density=0.05,balance=always,guard=false", "gaussiank:density=0.05",
		"osp:budget=0.5"}
	for _, spec := range specs {
		for _, p := range []int{2, 3, 4, 5, 8} {
			if spec == "gtopk:density=0.05" && !isPow2(p) {
				continue
			}
			if strings.Contains(spec, "teams=2") && p%2 != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%s/P=%d", spec, p), func(t *testing.T) {
				tr := trainDDP(t, spec, p, steps, ddpTraining{bucketCap: smallBuckets, lgp: true, check: func(dp *ddp.DDP) error {
					if strings.HasPrefix(spec, "spardl") && !strings.Contains(spec, "buckets=ddp") {
						if len(dp.Plan()) != 1 {
							return fmt.Errorf("spardl's default plan: want one bucket with the whole model, got %d", len(dp.Plan()))
						}
						return nil
					}
					return severalBuckets(dp)
				}})
				checkReplicasAgree(t, "", tr.hashes)
			})
		}
	}
}

func syntheticBatch(seed uint64, n int) (*nn.Tensor, []int) {
	rng := nn.NewRand(seed)
	x := nn.NewTensor(n, 3, 8, 8)
	for i := range x.Data {
		x.Data[i] = float32(rng.NormFloat64())
	}
	y := make([]int, n)
	for i := range y {
		y[i] = rng.IntN(5)
	}
	return x, y
}
