package hooks

import (
	"context"
	"fmt"
	"strings"

	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// OSP with LGP on (its default) refuses to train before dp.SetCorrector instead of silently
// behaving as an all-reduce; with the corrector, or with osp:lgp=false, it trains.
func TestOSPRefusesWithoutCorrector(t *testing.T) {
	for _, c := range []struct {
		spec      string
		corrector bool
		want      string // the error's text; "" for none
	}{
		{"osp:budget=0.5", false, "hook osp needs the optimizer's cooperation (local-gradient prediction): call dp.SetCorrector(opt)"},
		{"osp", false, "osp:lgp=false"},
		{"osp:budget=0.5", true, ""},
		{"osp:budget=0.5,lgp=false", false, ""},
	} {
		eachRank(t, 2, func(ctx context.Context, g comm.Group) error {
			h, err := Parse(c.spec)
			if err != nil {
				return err
			}
			dp, err := ddp.New(ctx, tinyNet(1), g, ddp.WithCommHook(h))
			if err != nil {
				return err
			}
			defer dp.Close()
			if c.corrector {
				opt, err := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.05, Momentum: 0.9})
				if err != nil {
					return err
				}
				dp.SetCorrector(opt)
			}
			for step := range 3 {
				x, y := syntheticBatch(uint64(10*g.Rank()+step), 2)
				err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(nn.NewTape().Const(x)), y))
				switch {
				case c.want == "" && err != nil:
					return fmt.Errorf("%s, SetCorrector %v, step %d: %w", c.spec, c.corrector, step, err)
				case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
					return fmt.Errorf("%s without SetCorrector, step %d: err = %v, want %q", c.spec, step, err, c.want)
				}
			}
			return dp.Flush(ctx)
		})
	}
}
