package train

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
)

// marshalFinite is json.Marshal for records that may hold NaN or ±Inf (a diverged run's loss):
// encoding/json refuses them, so such a record is re-encoded with every non-finite number
// written as null, as JavaScript's JSON.stringify does. Other values encode as json.Marshal
// encodes them.
func marshalFinite(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	var unsupported *json.UnsupportedValueError
	if err == nil || !errors.As(err, &unsupported) {
		return b, err
	}
	return json.Marshal(finiteValue(reflect.ValueOf(v)))
}

// finiteValue returns v as plain JSON values (maps, slices, numbers, strings) with non-finite
// floats replaced by nil. Structs follow encoding/json's field rules for names, "-" and
// omitempty on exported fields; values with their own MarshalJSON are kept as they are.
func finiteValue(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	if v.Type().Implements(reflect.TypeFor[json.Marshaler]()) {
		if (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil() {
			return nil
		}
		return v.Interface()
	}
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		if f := v.Float(); math.IsNaN(f) || math.IsInf(f, 0) {
			return nil
		}
		return v.Interface()
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return finiteValue(v.Elem())
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = finiteValue(v.Index(i))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		out := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			out[fmtKey(it.Key())] = finiteValue(it.Value())
		}
		return out
	case reflect.Struct:
		out := map[string]any{}
		addFields(out, v)
		return out
	}
	return v.Interface()
}

func fmtKey(k reflect.Value) string {
	if k.Kind() == reflect.String {
		return k.String()
	}
	b, _ := json.Marshal(k.Interface())
	return strings.Trim(string(b), `"`)
}

// addFields adds v's exported fields to out by encoding/json's rules, embedded structs
// without a name flattened.
func addFields(out map[string]any, v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		fv := v.Field(i)
		if f.Anonymous && name == "" {
			if fv.Kind() == reflect.Pointer {
				if fv.IsNil() {
					continue
				}
				fv = fv.Elem()
			}
			if fv.Kind() == reflect.Struct {
				addFields(out, fv)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if strings.Contains(","+opts+",", ",omitempty,") && fv.IsZero() {
			continue
		}
		out[name] = finiteValue(fv)
	}
}
