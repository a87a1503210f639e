package checkpoint

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/comm"
)

// Tags of Save's collectives (below DDP's bucket tags; the examples use 99-102, DDP 1-33).
const (
	tagDigests uint32 = 120
	tagReady   uint32 = 130
	tagWritten uint32 = 140
	tagDone    uint32 = 150
)

// digests returns "section/key" → SHA-256 of the values' bytes.
func digests(model, opt map[string][]float32) map[string][32]byte {
	d := map[string][32]byte{}
	for k, v := range model {
		d[pfxModel+k] = sha256.Sum256(comm.F32Bytes(v))
	}
	for k, v := range opt {
		d[pfxOptim+k] = sha256.Sum256(comm.F32Bytes(v))
	}
	return d
}

// compareWithRank0 finds the model and optimizer entries whose values differ from rank 0's
// (or that rank 0 lacks), and rank 0's entries this rank lacks.
func compareWithRank0(ctx context.Context, g comm.Group, model, opt map[string][]float32) (diffModel, dropModel, diffOpt, dropOpt []string, err error) {
	mine := digests(model, opt)
	var enc []byte
	for _, k := range slices.Sorted(maps.Keys(mine)) {
		d := mine[k]
		enc = strconv.AppendQuote(enc, k)
		enc = append(enc, ' ')
		enc = append(enc, d[:]...)
	}
	all, err := comm.AllGatherBytes(ctx, g, tagDigests, enc)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if g.Rank() == 0 {
		return nil, nil, nil, nil, nil
	}
	ref := map[string][32]byte{}
	rest := string(all[0])
	for rest != "" {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil || len(rest) < len(q)+1+32 {
			return nil, nil, nil, nil, fmt.Errorf("rank 0 sent a malformed digest list")
		}
		k, _ := strconv.Unquote(q)
		var d [32]byte
		copy(d[:], rest[len(q)+1:])
		ref[k] = d
		rest = rest[len(q)+1+32:]
	}
	for k, d := range mine {
		if r, ok := ref[k]; !ok || r != d {
			if s, ok := strings.CutPrefix(k, pfxModel); ok {
				diffModel = append(diffModel, s)
			} else {
				diffOpt = append(diffOpt, strings.TrimPrefix(k, pfxOptim))
			}
		}
	}
	for k := range ref {
		if _, ok := mine[k]; !ok {
			if s, ok := strings.CutPrefix(k, pfxModel); ok {
				dropModel = append(dropModel, s)
			} else {
				dropOpt = append(dropOpt, strings.TrimPrefix(k, pfxOptim))
			}
		}
	}
	slices.Sort(dropModel)
	slices.Sort(dropOpt)
	return diffModel, dropModel, diffOpt, dropOpt, nil
}

// agree tells every rank whether any rank failed (a collective when g has several ranks);
// it returns this rank's error, or one saying which rank failed.
func agree(ctx context.Context, g comm.Group, tag uint32, mine error) error {
	if g == nil || g.Size() == 1 {
		return mine
	}
	flags := make([]float32, g.Size())
	if mine != nil {
		flags[g.Rank()] = 1
	}
	if err := comm.AllReduce(ctx, g, tag, flags, comm.Auto); err != nil {
		if mine != nil {
			return errors.Join(mine, err)
		}
		return err
	}
	if mine != nil {
		return mine
	}
	for r, f := range flags {
		if f != 0 {
			return fmt.Errorf("rank %d failed to save its part", r)
		}
	}
	return nil
}
