package checkpoint

import (
	"encoding/json"
	"testing"
)

// FuzzParseInfo feeds meta.json's parser arbitrary bytes: it returns an error or a
// description that encodes and parses back to itself, never panics.
func FuzzParseInfo(f *testing.F) {
	f.Add([]byte(`{"meta":{"model":"vgg11","hook":"spardl:density=0.01","world_size":4,"config":{"lr":"0.1"},"spargo_version":"devel"},"position":{"epoch":1,"step":2,"samples":64,"iteration":8,"totals":{"loss":2.5}}}`))
	f.Add([]byte(`{"meta":{"model":"m","hook":"","world_size":1,"spargo_version":""},"position":{"epoch":0,"step":0,"samples":0,"iteration":0},"files":{"model.safetensors":{"sha256":"` + hex64 + `","size":8,"tensors":{"w":"` + hex64 + `"}}}}`))
	f.Add([]byte(`{"meta":{},"position":{}} {}`))
	f.Add([]byte(`{"files":{"../x.safetensors":{"sha256":"` + hex64 + `"}}}`))
	f.Add([]byte(`{"x":1}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := parseInfo(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("a parsed description does not encode: %v", err)
		}
		if _, err := parseInfo(again); err != nil {
			t.Fatalf("a parsed description does not parse again: %v\n%s", err, again)
		}
	})
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
