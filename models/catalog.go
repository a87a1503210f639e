package models

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// Entry is one model of the catalogue: what `spargo models` lists, what the benchmarks
// and the simulator accept for -model, and what New builds.
type Entry struct {
	Name    string // unique, lower case: "vgg16", "vgg16-cifar100", "bert-base"
	Family  string // "vgg", "resnet", "lstm", "bert"
	Summary string // one line: data set, configuration
	// Build returns the model initialised from rng (PyTorch's default initialisation
	// unless the family says otherwise).
	Build func(rng *rand.Rand) (nn.Module, error)
}

// catalogue lists every family's entries. A family adds its models with one function
// returning its entries, called here.
func catalogue() []Entry {
	var es []Entry
	for _, fam := range [][]Entry{vggEntries(), bertEntries(), lstmEntries()} {
		es = append(es, fam...)
	}
	sort.SliceStable(es, func(i, j int) bool { return es[i].Name < es[j].Name })
	return es
}

// Catalog returns every built-in model, sorted by name.
func Catalog() []Entry { return catalogue() }

// Names returns the names New accepts, sorted.
func Names() []string {
	es := catalogue()
	names := make([]string, len(es))
	for i, e := range es {
		names[i] = e.Name
	}
	return names
}

// Lookup returns the catalogue entry called name (case-insensitive).
func Lookup(name string) (Entry, error) {
	for _, e := range catalogue() {
		if strings.EqualFold(e.Name, name) {
			return e, nil
		}
	}
	return Entry{}, fmt.Errorf("models: unknown model %q (have %s)", name, strings.Join(Names(), ", "))
}

// New builds the catalogue model called name, initialised from rng.
//
//	m, err := models.New("vgg16", nn.NewRand(0)) // VGG-16 for CIFAR-10, 14,728,266 parameters
func New(name string, rng *rand.Rand) (nn.Module, error) {
	e, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	return e.Build(rng)
}

// vggEntries are the VGG variants for CIFAR-10 (plain name) and CIFAR-100 ("-cifar100").
func vggEntries() []Entry {
	var es []Entry
	for _, ds := range []Dataset{CIFAR10, CIFAR100} {
		for _, name := range VGGNames() {
			full := name
			if ds != CIFAR10 {
				full += "-" + ds.Name
			}
			es = append(es, Entry{
				Name: full, Family: "vgg",
				Summary: fmt.Sprintf("%s with BatchNorm for %s (32×32, %d classes)", strings.ToUpper(name[:3])+"-"+name[3:], ds.Name, ds.Classes),
				Build:   func(rng *rand.Rand) (nn.Module, error) { return NewVGG(name, ds, rng) },
			})
		}
	}
	return es
}

// bertEntries are BERT for pre-training at each preset size ("bert-tiny" … "bert-base").
func bertEntries() []Entry {
	var es []Entry
	for _, p := range BertPresets() {
		es = append(es, Entry{
			Name: "bert-" + p, Family: "bert",
			Summary: "BERT for pre-training (MLM + NSP heads, decoder tied to the word embeddings), preset " + p,
			Build: func(rng *rand.Rand) (nn.Module, error) {
				cfg, err := BertPreset(p)
				if err != nil {
					return nil, err
				}
				return NewBertForPreTraining(cfg, rng)
			},
		})
	}
	return es
}
