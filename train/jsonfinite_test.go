package train

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func TestMarshalFiniteWritesNull(t *testing.T) {
	type inner struct {
		Loss float32 `json:"loss"`
	}
	type rec struct {
		Epoch int       `json:"epoch"`
		Loss  float64   `json:"train_loss"`
		Skip  float64   `json:"-"`
		Empty string    `json:"empty,omitempty"`
		Accs  []float64 `json:"accs"`
		In    inner     `json:"in"`
		M     map[string]float64
	}
	r := rec{Epoch: 2, Loss: math.NaN(), Skip: 1, Accs: []float64{0.5, math.Inf(1)}, In: inner{float32(math.Inf(-1))}, M: map[string]float64{"a": math.NaN(), "b": 3}}
	if _, err := json.Marshal(r); err == nil {
		t.Fatal("encoding/json accepts NaN: the fallback is not exercised")
	}
	b, err := marshalFinite(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"M":{"a":null,"b":3},"accs":[0.5,null],"epoch":2,"in":{"loss":null},"train_loss":null}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	// Finite records encode exactly as encoding/json does.
	r.Loss, r.Accs, r.In.Loss, r.M = 1.5, []float64{0.25}, 2, nil
	got, _ := marshalFinite(r)
	std, _ := json.Marshal(r)
	if string(got) != string(std) {
		t.Fatalf("finite record: got %s, encoding/json %s", got, std)
	}
}

func TestPrinterKeepsDivergedEpochLine(t *testing.T) {
	var out strings.Builder
	p, err := NewPrinter(&out, "json")
	if err != nil {
		t.Fatal(err)
	}
	if err := Print(p, "epoch", struct {
		Loss float64 `json:"train_loss"`
	}{math.NaN()}, "epoch 1 train_loss NaN"); err != nil {
		t.Fatal(err)
	}
	p.Flush()
	if !strings.Contains(out.String(), `"msg":"epoch","train_loss":null`) {
		t.Fatalf("JSON line: %q", out.String())
	}
}
