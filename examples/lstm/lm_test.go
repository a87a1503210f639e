package main

import (
	"testing"

	"github.com/spargo-dl/spargo/train"
)

func TestIMDBDefaultsKeepGivenFlags(t *testing.T) {
	c := LMConfig{Task: "imdb", Model: "small", Batch: 20, Clip: 0.25, Flags: train.Flags{LR: 20, Optim: "sgd", Schedule: "ptb"}}
	c.imdbDefaults(func(f string) bool { return f == "lr" })
	if c.Model != "lstm-imdb" || c.Optim != "adam" || c.Batch != 32 || c.Clip != 0 || c.Schedule != "" || c.LR != 20 {
		t.Fatalf("after imdb defaults with -lr given: %+v", c)
	}
	lm := LMConfig{Task: "lm", Model: "small"}
	lm.imdbDefaults(func(string) bool { return false })
	if lm.Model != "small" {
		t.Fatal("imdb defaults applied to -task lm")
	}
	for name, hidden := range map[string]int{"small": 200, "medium": 650, "ptb": 1500, "lstm-ptb-small": 200} {
		cfg, err := LMModelConfig(name, 42)
		if err != nil || cfg.Hidden != hidden || cfg.Vocab != 42 {
			t.Errorf("-model %s: %+v %v", name, cfg, err)
		}
	}
}
