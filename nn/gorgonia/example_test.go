package gorgonia_test

import (
	"fmt"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/spargo-dl/spargo/nn"
	sgorgonia "github.com/spargo-dl/spargo/nn/gorgonia"
)

// A classifier whose feature layer is spargo's and whose head is a two-layer perceptron
// written in gorgonia. The head's learnables are ordinary named nn.Params; backward reaches
// them through the tape and fires their grad-ready hooks (what DDP buckets), and a batch of
// another size builds a second graph.
func ExampleNewBlock() {
	rng := nn.NewRand(1)
	head, err := sgorgonia.NewBlock(func(b *sgorgonia.Builder, xs ...*G.Node) (*G.Node, error) {
		w1 := b.Param("fc1.weight", sgorgonia.KaimingUniform(8), 8, 16) // gorgonia layout: [in, out]
		b1 := b.Param("fc1.bias", sgorgonia.KaimingUniform(8), 16)
		w2 := b.Param("fc2.weight", sgorgonia.KaimingUniform(16), 16, 3)
		b2 := b.Param("fc2.bias", sgorgonia.KaimingUniform(16), 3)
		h := G.Must(G.Rectify(G.Must(G.BroadcastAdd(G.Must(G.Mul(xs[0], w1)), b1, nil, []byte{0}))))
		return G.BroadcastAdd(G.Must(G.Mul(h, w2)), b2, nil, []byte{0})
	}, rng, []int{4, 8}) // built for batches of 4 with 8 features
	if err != nil {
		fmt.Println(err)
		return
	}
	model := nn.NewSequential().Add("features", nn.NewLinear(5, 8, true, rng)).Add("head", head)
	for _, p := range nn.Parameters(model) {
		fmt.Println(p.Name, p.Value.Shape)
	}

	tape := nn.NewTape()
	var ready []string
	tape.OnGradReady(func(p *nn.Param) { ready = append(ready, p.Name) })
	for _, batch := range []int{4, 3} {
		tape.Reset()
		x := nn.NewTensor(batch, 5)
		for i := range x.Data {
			x.Data[i] = float32(i%7) / 7
		}
		logits := model.Forward(tape.Const(x))
		loss := nn.CrossEntropy(logits, make([]int, batch))
		if err := tape.Backward(loss); err != nil {
			fmt.Println(err)
			return
		}
		slices.Sort(ready[:4])
		fmt.Printf("batch %d: logits %v, grad-ready %v\n", batch, logits.Shape(), ready)
		ready = ready[:0]
	}
	fmt.Println("graphs:", head.Graphs())

	// Tensors cross without copying.
	w := head.OwnParams()[0].Value
	d := sgorgonia.ToDense(w)
	_ = d.SetAt(float32(0.5), 0, 0)
	fmt.Println(d.Shape(), w.Data[0], d.Dtype() == tensor.Float32)
	// Output:
	// features.weight [8 5]
	// features.bias [8]
	// head.fc1.weight [8 16]
	// head.fc1.bias [16]
	// head.fc2.weight [16 3]
	// head.fc2.bias [3]
	// batch 4: logits [4 3], grad-ready [head.fc1.bias head.fc1.weight head.fc2.bias head.fc2.weight features.weight features.bias]
	// batch 3: logits [3 3], grad-ready [head.fc1.bias head.fc1.weight head.fc2.bias head.fc2.weight features.weight features.bias]
	// graphs: 2
	// (8, 16) 0.5 true
}
