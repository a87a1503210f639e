package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// modelInfo is one model of `spargo models -json`.
type modelInfo struct {
	Name    string `json:"name"`
	Family  string `json:"family"`
	Params  int    `json:"params"`
	Tensors int    `json:"tensors"`
	Dataset string `json:"dataset,omitempty"` // the image input's data set; empty for token models
	Summary string `json:"summary"`
}

const modelsHelp = `usage: spargo models [-json] [NAME|FAMILY ...]

Lists the model catalogue (the names -model accepts in spargo bench train, spargo bench comm,
spargo simulate and the examples) with each model's parameter and tensor counts, built from
its definition. Arguments select models by name or family (vgg, resnet, bert, ...); without
any, every model is listed (building the large ones takes a few seconds).
`

func runModels(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo models", flag.ContinueOnError)
	fs.SetOutput(stdout)
	asJSON := fs.Bool("json", false, "print a JSON array of {name, family, params, tensors, dataset, summary}")
	fs.Usage = func() {
		fmt.Fprint(stdout, modelsHelp)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	entries, err := selectModels(fs.Args())
	if err != nil {
		return err
	}
	infos := make([]modelInfo, 0, len(entries))
	if !*asJSON {
		fmt.Fprintf(stdout, "%-20s %-7s %12s %7s  %s\n", "model", "family", "parameters", "tensors", "summary")
	}
	for _, e := range entries {
		m, err := e.Build(nn.NewRand(0))
		if err != nil {
			return fmt.Errorf("models: %s: %w", e.Name, err)
		}
		ps := nn.Parameters(m)
		info := modelInfo{Name: e.Name, Family: e.Family, Params: nn.NumParams(ps), Tensors: len(ps), Dataset: e.Input.Name, Summary: e.Summary}
		if *asJSON {
			infos = append(infos, info)
			continue
		}
		fmt.Fprintf(stdout, "%-20s %-7s %12d %7d  %s\n", info.Name, info.Family, info.Params, info.Tensors, info.Summary)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", " ")
		return enc.Encode(infos)
	}
	return nil
}

// selectModels returns the catalogue entries named or in the families given, in catalogue
// order; all of them for no arguments.
func selectModels(args []string) ([]models.Entry, error) {
	all := models.Catalog()
	if len(args) == 0 {
		return all, nil
	}
	want := map[string]bool{}
	for _, a := range args {
		a = strings.ToLower(a)
		found := false
		for _, e := range all {
			if e.Name == a || e.Family == a {
				want[e.Name], found = true, true
			}
		}
		if !found {
			return nil, fmt.Errorf("models: %q is neither a model nor a family (have %s)", a, strings.Join(models.Names(), ", "))
		}
	}
	var es []models.Entry
	for _, e := range all {
		if want[e.Name] {
			es = append(es, e)
		}
	}
	return es, nil
}
