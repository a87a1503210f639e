package safetensors_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/spargo-dl/spargo/safetensors"
)

// Write two tensors and metadata, read them back.
func Example() {
	dir, err := os.MkdirTemp("", "safetensors")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "model.safetensors")

	f := safetensors.New()
	f.Metadata["format"] = "pt"
	f.Tensors["fc.weight"] = safetensors.FromFloat32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	f.Tensors["step"] = safetensors.FromInt64([]int64{100})
	if err := f.WriteFile(path); err != nil { // atomic: temp file + rename
		log.Fatal(err)
	}

	g, err := safetensors.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	w, _ := g.Float32("fc.weight")
	step, _ := g.Tensors["step"].Int64()
	fmt.Println(g.Names(), g.Tensors["fc.weight"].Shape, w, step, g.Metadata["format"])
	// Output: [fc.weight step] [2 3] [1 2 3 4 5 6] [100] pt
}
