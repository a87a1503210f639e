package cluster

import (
	"reflect"
	"strings"
	"testing"
)

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestDetectEnv(t *testing.T) {
	torchrun := map[string]string{
		"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "job42",
		"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2",
	}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	slurm := map[string]string{
		"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4",
		"SLURM_JOB_NODELIST": "gpu[07-08,11],login1", "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0",
	}
	for _, tc := range []struct {
		name    string
		flags   Overrides
		env     map[string]string
		want    Env
		wantErr string // substring; "" means success
	}{
		{name: "nothing: single process", env: map[string]string{"HOME": "/root"},
			want: Env{Source: SourceSingle, WorldSize: 1, LocalWorldSize: 1, RunID: "spargo"}},

		{name: "flags", flags: Overrides{WorldSize: 4, Rank: 2, MasterAddr: "h0", MasterPort: 1234, RunID: "r"},
			env:  torchrun, // flags come first
			want: Env{Source: SourceFlags, Rank: 2, WorldSize: 4, LocalRank: 2, LocalWorldSize: 4, MasterAddr: "h0", MasterPort: 1234, RunID: "r"}},
		{name: "flags with master from env and default port", flags: Overrides{WorldSize: 2, Rank: 1},
			env:  map[string]string{"SPARGO_MASTER_ADDR": "head", "MASTER_ADDR": "ignored"},
			want: Env{Source: SourceFlags, Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "head", MasterPort: 29500, RunID: "spargo"}},
		{name: "flags without master address", flags: Overrides{WorldSize: 2, Rank: 1},
			wantErr: "no master address: set SPARGO_MASTER_ADDR"},
		{name: "flags with rank out of range", flags: Overrides{WorldSize: 2, Rank: 2, MasterAddr: "h"},
			wantErr: "rank 2 is outside [0, 2)"},

		{name: "torchrun agent store", env: torchrun,
			want: Env{Source: SourceTorchrun, Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2,
				MasterAddr: "10.0.0.1", MasterPort: 29400, UseAgentStore: true, RestartCount: 2, RunID: "job42"}},
		{name: "torchrun standalone: rank 0 hosts the store", env: with(torchrun, "TORCHELASTIC_USE_AGENT_STORE", "False", "TORCHELASTIC_RESTART_COUNT", "0"),
			want: Env{Source: SourceTorchrun, Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2,
				MasterAddr: "10.0.0.1", MasterPort: 29400, RunID: "job42"}},
		{name: "spargo launch", env: map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "40000", "SPARGO_RESTART_COUNT": "1", "SPARGO_RUN_ID": "launch-x"},
			want: Env{Source: SourceTorchrun, Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2,
				MasterAddr: "127.0.0.1", MasterPort: 40000, RestartCount: 1, RunID: "launch-x"}},
		{name: "torchrun without WORLD_SIZE", env: with(torchrun, "WORLD_SIZE", "<unset>"),
			wantErr: "torchrun environment is incomplete: LOCAL_RANK is set but WORLD_SIZE is not"},
		{name: "torchrun with several missing", env: map[string]string{"LOCAL_RANK": "0", "RANK": "0"},
			wantErr: "WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not"},
		{name: "torchrun agent store without restart count", env: with(torchrun, "TORCHELASTIC_RESTART_COUNT", "<unset>"),
			wantErr: "TORCHELASTIC_RESTART_COUNT is not"},
		{name: "torchrun with a bad RANK", env: with(torchrun, "RANK", "three"),
			wantErr: `RANK="three" is not an integer`},
		{name: "torchrun with an empty variable counts as unset", env: with(torchrun, "MASTER_PORT", ""),
			wantErr: "MASTER_PORT is not"},
		{name: "torchrun with a bad agent-store flag", env: with(torchrun, "TORCHELASTIC_USE_AGENT_STORE", "maybe"),
			wantErr: `TORCHELASTIC_USE_AGENT_STORE="maybe"`},
		{name: "torchrun with rank beyond world", env: with(torchrun, "RANK", "8"),
			wantErr: "rank 8 is outside [0, 8)"},

		{name: "slurm", env: slurm,
			want: Env{Source: SourceSlurm, Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4,
				MasterAddr: "gpu07", MasterPort: 29500, RunID: "slurm-1234.0"}},
		{name: "slurm with SLURM_NPROCS and explicit master", env: with(slurm, "SLURM_NTASKS", "<unset>", "SLURM_NPROCS", "8",
			"MASTER_ADDR", "ib-gpu07", "MASTER_PORT", "31000", "SLURM_NTASKS_PER_NODE", "2(x4)"),
			want: Env{Source: SourceSlurm, Rank: 5, WorldSize: 8, LocalRank: 1,
				MasterAddr: "ib-gpu07", MasterPort: 31000, RunID: "slurm-1234.0"}},
		{name: "slurm without SLURM_NTASKS", env: with(slurm, "SLURM_NTASKS", "<unset>"),
			wantErr: "Slurm environment is incomplete: SLURM_PROCID is set but SLURM_NTASKS is not"},
		{name: "slurm without nodelist", env: with(slurm, "SLURM_JOB_NODELIST", "<unset>"),
			wantErr: "lacks SLURM_JOB_NODELIST"},
		{name: "slurm with a broken nodelist", env: with(slurm, "SLURM_JOB_NODELIST", "gpu[07-"),
			wantErr: "SLURM_JOB_NODELIST"},
		{name: "slurm falls back to SLURM_NODELIST", env: with(slurm, "SLURM_JOB_NODELIST", "<unset>", "SLURM_NODELIST", "a[3-4]"),
			want: Env{Source: SourceSlurm, Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4,
				MasterAddr: "a3", MasterPort: 29500, RunID: "slurm-1234.0"}},

		{name: "open mpi", env: map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
			"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "SPARGO_MASTER_ADDR": "n1", "SPARGO_MASTER_PORT": "5000"},
			want: Env{Source: SourceMPI, Rank: 2, WorldSize: 4, LocalWorldSize: 1, MasterAddr: "n1", MasterPort: 5000, RunID: "spargo"}},
		{name: "open mpi with master flag", flags: Overrides{MasterAddr: "flaghost"},
			env:  map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "envhost"},
			want: Env{Source: SourceMPI, Rank: 1, WorldSize: 2, MasterAddr: "flaghost", MasterPort: 29500, RunID: "spargo"}},
		{name: "open mpi without master", env: map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
			wantErr: "MPI environment (OMPI_COMM_WORLD_RANK is set) gives no master address"},
		{name: "open mpi half set", env: map[string]string{"OMPI_COMM_WORLD_RANK": "1", "MASTER_ADDR": "h"},
			wantErr: "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"},
		{name: "pmi (mpich, intel mpi)", env: map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h"},
			want: Env{Source: SourceMPI, Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "h", MasterPort: 29500, RunID: "spargo"}},
		{name: "pmi half set", env: map[string]string{"PMI_SIZE": "4"},
			wantErr: "PMI_SIZE is set but PMI_RANK is not"},

		{name: "kubernetes pytorchjob", env: map[string]string{"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
			want: Env{Source: SourceKubernetes, Rank: 1, WorldSize: 3, LocalWorldSize: 1, MasterAddr: "job-master-0", MasterPort: 23456, RunID: "spargo"}},
		{name: "kubernetes RANK without WORLD_SIZE", env: map[string]string{"RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "1"},
			wantErr: "RANK is set but WORLD_SIZE is not"},
		{name: "kubernetes master from PET_ variables", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "23456"},
			want: Env{Source: SourceKubernetes, Rank: 0, WorldSize: 2, LocalWorldSize: 1, MasterAddr: "m", MasterPort: 23456, RunID: "spargo"}},
		{name: "kubernetes elastic PET_ variables", env: map[string]string{"PET_NNODES": "4:4", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "1",
			"PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456"},
			want: Env{Source: SourceKubernetes, Rank: 2, WorldSize: 4, LocalWorldSize: 1, MasterAddr: "job-master-0", MasterPort: 23456, RunID: "spargo"}},
		{name: "kubernetes elastic range", env: map[string]string{"PET_NNODES": "2:4", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"},
			wantErr: "elastic range"},
		{name: "kubernetes several processes per pod", env: map[string]string{"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "4", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"},
			wantErr: "PET_NPROC_PER_NODE=4"},
		{name: "kubernetes PET_ half set", env: map[string]string{"PET_NNODES": "2", "PET_NODE_RANK": "0"},
			wantErr: "PET_MASTER_ADDR, PET_MASTER_PORT are not"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DetectEnvFrom(tc.flags, lookupMap(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestExpandNodelist(t *testing.T) {
	for _, tc := range []struct {
		list string
		want []string
		err  string
	}{
		{list: "node[01-04,07],gpu3", want: []string{"node01", "node02", "node03", "node04", "node07", "gpu3"}},
		{list: "single", want: []string{"single"}},
		{list: "a,b , c", want: []string{"a", "b", "c"}},
		{list: "n[8-11]", want: []string{"n8", "n9", "n10", "n11"}},
		{list: "n[098-101]", want: []string{"n098", "n099", "n100", "n101"}},
		{list: "rack[1-2]-n[1,3]", want: []string{"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"}},
		{list: "gpu[5]x", want: []string{"gpu5x"}},
		{list: "node[01-04", err: "unclosed"},
		{list: "node]1[", err: "without '['"},
		{list: "n[[1]]", err: "nested"},
		{list: "n[4-2]", err: "not low-high"},
		{list: "n[a-b]", err: "not a number"},
		{list: "n[1,,2]", err: "empty range"},
		{list: "n[1-]", err: "empty range"},
		{list: "", err: "names no host"},
		{list: "n[1-99999999]", err: "too many hosts"},
		{list: "n[1-1000]-[1-1000]-[1-1000]", err: "too many hosts"},
	} {
		got, err := ExpandNodelist(tc.list, 0)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ExpandNodelist(%q) = %v, %v; want error with %q", tc.list, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ExpandNodelist(%q) = %v, %v; want %v", tc.list, got, err, tc.want)
			continue
		}
		first, err := FirstNode(tc.list)
		if err != nil || first != tc.want[0] {
			t.Errorf("FirstNode(%q) = %q, %v; want %q", tc.list, first, err, tc.want[0])
		}
	}
	if _, err := ExpandNodelist("n[1-10]", 5); err == nil {
		t.Error("limit 5 accepted 10 hosts")
	}
	if _, err := ExpandNodelist("a,b,c", 2); err == nil || !strings.Contains(err.Error(), "more than 2 hosts") {
		t.Errorf("limit 2 on three items: %v", err)
	}
	// FirstNode does not expand what it does not need.
	if first, err := FirstNode("big[0001-9999]-[1-99],x"); err != nil || first != "big0001-1" {
		t.Errorf("FirstNode of a large list = %q, %v", first, err)
	}
}
