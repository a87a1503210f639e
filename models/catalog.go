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
	// Input is the image input of an image classifier (VGG, ResNet): channels, size and
	// classes of the data set it is built for. Zero (Size 0) for models that read tokens.
	Input Dataset
	// Build returns the model initialised from rng (PyTorch's default initialisation
	// unless the family says otherwise).
	Build func(rng *rand.Rand) (nn.Module, error)
}

// catalogue lists every family's entries. A family adds its models with one function
// returning its entries, called here.
func catalogue() []Entry {
	var es []Entry
	for _, fam := range [][]Entry{vggEntries(), resnetEntries(), bertEntries(), lstmEntries()} {
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

// LookupImage returns the image classifier called name built for ds: the entry name
// itself when its input is ds, else the variant "name-<ds.Name>" ("resnet20" with
// CIFAR100 is "resnet20-cifar100"). It is how a training program for one data set
// accepts the catalogue's names.
func LookupImage(name string, ds Dataset) (Entry, error) {
	e, err := Lookup(name)
	if err != nil {
		return Entry{}, err
	}
	if e.Input == ds {
		return e, nil
	}
	if v, err := Lookup(name + "-" + ds.Name); err == nil && v.Input == ds {
		return v, nil
	}
	if e.Input.Size == 0 {
		return Entry{}, fmt.Errorf("models: %s is not an image classifier (family %s)", e.Name, e.Family)
	}
	return Entry{}, fmt.Errorf("models: %s is built for %s (%d×%d, %d classes) and has no %s variant", e.Name, e.Input.Name, e.Input.Size, e.Input.Size, e.Input.Classes, ds.Name)
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

// cifarEntries returns one entry per name and CIFAR data set: the plain name for
// CIFAR-10, "-cifar100" appended for CIFAR-100.
func cifarEntries(family string, names []string, summary func(name string, ds Dataset) string,
	build func(name string, ds Dataset, rng *rand.Rand) (nn.Module, error)) []Entry {
	var es []Entry
	for _, ds := range []Dataset{CIFAR10, CIFAR100} {
		for _, name := range names {
			full := name
			if ds != CIFAR10 {
				full += "-" + ds.Name
			}
			es = append(es, Entry{Name: full, Family: family, Input: ds, Summary: summary(name, ds),
				Build: func(rng *rand.Rand) (nn.Module, error) { return build(name, ds, rng) }})
		}
	}
	return es
}

// vggEntries are the VGG variants for CIFAR-10 (plain name) and CIFAR-100 ("-cifar100").
func vggEntries() []Entry {
	return cifarEntries("vgg", VGGNames(),
		func(name string, ds Dataset) string {
			return fmt.Sprintf("%s with BatchNorm for %s (32×32, %d classes)", strings.ToUpper(name[:3])+"-"+name[3:], ds.Name, ds.Classes)
		},
		func(name string, ds Dataset, rng *rand.Rand) (nn.Module, error) { return NewVGG(name, ds, rng) })
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

// resnetEntries are the CIFAR ResNets for CIFAR-10 (plain name) and CIFAR-100
// ("-cifar100"), and torchvision's ImageNet ResNets ("resnet18" … "resnet152").
func resnetEntries() []Entry {
	es := cifarEntries("resnet", CIFARResNetNames(),
		func(name string, ds Dataset) string {
			return fmt.Sprintf("ResNet-%s for %s (He et al. 2016: option-A shortcuts, 32×32, %d classes)", name[6:], ds.Name, ds.Classes)
		},
		func(name string, ds Dataset, rng *rand.Rand) (nn.Module, error) { return NewResNet(name, ds, rng) })
	for _, name := range ImageNetResNetNames() {
		es = append(es, Entry{
			Name: name, Family: "resnet", Input: ImageNet,
			Summary: fmt.Sprintf("ResNet-%s for ImageNet (torchvision's definition and names, 224×224, 1000 classes)", name[6:]),
			Build:   func(rng *rand.Rand) (nn.Module, error) { return NewResNet(name, ImageNet, rng) },
		})
	}
	return es
}
