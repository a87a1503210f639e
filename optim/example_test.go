package optim_test

import (
	"fmt"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// BERT's recipe: AdamW with decay 0.01 on the weights, none on biases and LayerNorm
// weights, and a linear warm-up then decay of the rate.
func ExampleNewAdamGroups() {
	params := []*nn.Param{nn.NewParam("encoder.0.attention.query.weight", 4), nn.NewParam("encoder.0.attention.query.bias", 4),
		nn.NewParam("encoder.0.LayerNorm.weight", 4)}
	opt, err := optim.NewAdamGroups(optim.NoDecayGroups(params, 0.01), optim.AdamConfig{LR: 1e-4, Decoupled: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	sched := optim.LinearWarmupDecay{Base: 1e-4, WarmupSteps: 10, TotalSteps: 100}
	for step := range 20 {
		optim.Apply(opt, sched, 0, step, 100)
		for _, p := range params {
			p.Grad.Data[0] = 1 // … backward …
		}
		opt.Step()
		opt.ZeroGrad()
	}
	fmt.Printf("lr %.2g after %d steps; no decay: %v %v %v\n", opt.LR(), opt.Steps(),
		optim.NoDecay(params[0].Name), optim.NoDecay(params[1].Name), optim.NoDecay(params[2].Name))
	// Output: lr 9e-05 after 20 steps; no decay: false true true
}

// Programs take -optim and -schedule strings.
func ExampleParseSchedule() {
	sched, err := optim.ParseSchedule("cosine:warmup=2,min=0.001", 0.1, 10, 50)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, epoch := range []int{0, 1, 2, 6, 9} {
		fmt.Printf("epoch %d: %.4f\n", epoch, sched.LR(epoch, 0, 50))
	}
	_, err = optim.ParseSchedule("cosine:warmpu=2", 0.1, 10, 50)
	fmt.Println(err)
	// Output:
	// epoch 0: 0.0000
	// epoch 1: 0.0500
	// epoch 2: 0.1000
	// epoch 6: 0.0505
	// epoch 9: 0.0048
	// optim: schedule cosine has no option "warmpu" (options: warmup, warmup_steps, min, per, total_steps)
}

func ExampleParseOptimizer() {
	params := []*nn.Param{nn.NewParam("fc.weight", 3), nn.NewParam("fc.bias", 3)}
	opt, err := optim.ParseOptimizer("adamw:wd=0.05,no_decay=true", params, 3e-4)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%T lr %g\n", opt, opt.LR())
	// Output: *optim.Adam lr 0.0003
}

// An -optim flag's spec parses once into a configuration whose String is canonical; a
// program's -momentum and -wd fill in what the spec leaves out, without writing a string.
func ExampleParseOptimizerConfig() {
	c, err := optim.ParseOptimizerConfig("sgd:nesterov=true,momentum=0.90")
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err = c.WithDefault("wd", 5e-4) // -wd, as the spec sets none
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c)
	opt, err := c.New([]*nn.Param{nn.NewParam("fc.weight", 4)}, 0.1)
	fmt.Println(opt.LR(), err)

	s, _ := optim.ParseScheduleConfig("cosine:per=step,warmup=2.0")
	fmt.Println(s)
	// Output:
	// sgd:momentum=0.9,dampening=0,nesterov=true,wd=0.0005
	// 0.1 <nil>
	// cosine:warmup=2,min=0,per=step
}
