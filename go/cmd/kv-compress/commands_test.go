package main

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"kvlib/pkg/compression"
)

func Example_usage() {
	run([]string{"-h"}, os.Stdout, os.Stderr)
	// Output:
	// usage: kv-compress COMMAND -input FILE [-output FILE] [flags]
	//
	// commands:
	//   compress    quantize and pack -input into the kvq layout at -output
	//   decompress  restore a kvq file at -input to its source dtypes at -output
	//   roundtrip   compress and restore in one go; -output is the restored cache
	//   metrics     compress in memory and print the metrics; writes nothing
	//   check       validate -scheme (and -bits, -group-size, -sparsity) and print it
	//   schemes     list the preset schemes
	//   gates       print the quality levels and the default quality gates
	//   serve       answer round-trip requests on stdin/stdout, tensors in shared memory (see serve.go)
	//
	// -scheme takes a preset (int4 int8 asym4 kivi4 kivi2 rot4 rot3 lm2rot
	// lm3rot lm4rot q4_0 q4_1 q5_0 q5_1 q8_0) or a spec such as
	// k=asym4/g64/channel,v=asym4/g64 (see docs/kv-compress/schemes.md).
	//
	// Each command prints one JSON object on stdout. Exit status: 0 success,
	// 1 quality gates failed (output still written), 2 bad usage or bad input.
	// Run 'kv-compress COMMAND -h' for the flags.
}

// The usage text and the package documentation list every command of the
// table, and the usage text every preset; each command answers -h.
func TestCommandTable(t *testing.T) {
	_, usage, _ := runCLI("-h")
	doc, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range commands {
		if seen[c.name] || c.short == "" || lookup(c.name) != c || (c.run == nil) == (c.main == nil) {
			t.Errorf("command %q: duplicate, without a short line, or not one of run and main", c.name)
		}
		seen[c.name] = true
		if !regexp.MustCompile(`(?m)^  ` + c.name + ` +` + regexp.QuoteMeta(c.short) + `$`).MatchString(usage) {
			t.Errorf("usage does not list %s", c.name)
		}
		if !strings.Contains(string(doc), "//\tkv-compress "+c.name+" ") {
			t.Errorf("the package documentation does not list %s", c.name)
		}
		if c.main != nil {
			continue
		}
		code, stdout, stderr := runCLI(c.name, "-h")
		if code != exitOK || stdout != "" || !strings.HasPrefix(stderr, "usage of kv-compress "+c.name+":\n") {
			t.Errorf("%s -h: exit %d, stdout %q, stderr %q", c.name, code, stdout, stderr)
		}
	}
	words := strings.Fields(usage)
	for _, p := range compression.PresetNames() {
		found := false
		for _, w := range words {
			found = found || strings.Trim(w, "()") == p
		}
		if !found {
			t.Errorf("usage does not list preset %s", p)
		}
	}
	if lookup("help") != nil || lookup("") != nil {
		t.Error("lookup found a command that is not in the table")
	}
}

// Each command takes the flags of its groups, and no others.
func TestCommandFlags(t *testing.T) {
	tests := []struct {
		cmd, flag string
		ok        bool
	}{
		{"compress", "-scheme", true}, {"compress", "-workers", true},
		{"decompress", "-workers", true}, {"decompress", "-scheme", false}, {"decompress", "-lossless", false},
		{"metrics", "-output", false}, {"metrics", "-max-rmse", true},
		{"check", "-input", false}, {"check", "-bits", true}, {"check", "-verbose", true},
		{"schemes", "-workers", true}, {"schemes", "-scheme", false},
		{"gates", "-workers", false}, {"gates", "-max-rmse", false},
	}
	for _, tc := range tests {
		_, _, stderr := runCLI(tc.cmd, "-h")
		if got := regexp.MustCompile(`\n  ` + tc.flag + `[ \n]`).MatchString(stderr); got != tc.ok {
			t.Errorf("%s -h lists %s: %v, want %v", tc.cmd, tc.flag, got, tc.ok)
		}
	}
}

func TestRunEdgeCases(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{""}, exitError, "kv-compress : unknown command \"\" (kv-compress -h for usage)\n"},
		{[]string{"help"}, exitOK, ""},
		{[]string{"gates", "x"}, exitError, "kv-compress gates: unexpected argument \"x\" (kv-compress -h for usage)\n"},
		{[]string{"gates", "-workers", "2"}, exitError, "kv-compress gates: flag provided but not defined: -workers (kv-compress -h for usage)\n"},
		{[]string{"serve", "-x"}, exitError, "kv-compress serve: takes no flags (the schemes come with each request)\n"},
		{[]string{"-serve"}, exitError, "kv-compress compress: flag provided but not defined: -serve (kv-compress -h for usage)\n"},
	}
	for _, tc := range tests {
		code, _, stderr := runCLI(tc.args...)
		if code != tc.code || stderr != tc.stderr {
			t.Errorf("%q: exit %d, stderr %q; want %d, %q", tc.args, code, stderr, tc.code, tc.stderr)
		}
	}
}

// gates prints the quality levels, best first, and the default gates
// under the keys a compress report uses for its thresholds.
func TestGates(t *testing.T) {
	code, stdout, stderr := runCLI("gates")
	if code != exitOK {
		t.Fatal(stderr)
	}
	var got struct {
		Command    string
		Levels     []map[string]any
		Thresholds map[string]any
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"name": "EXCELLENT", "max_rmse": 0.01, "min_snr_db": 40.0},
		{"name": "GOOD", "max_rmse": 0.05, "min_snr_db": 30.0},
		{"name": "ACCEPTABLE", "max_rmse": 0.1, "min_snr_db": 18.0},
		{"name": "POOR", "max_rmse": math.MaxFloat64, "min_snr_db": -math.MaxFloat64},
	}
	if got.Command != "gates" || !reflect.DeepEqual(got.Levels, want) {
		t.Errorf("gates printed %s", stdout)
	}
	th := compression.DefaultThresholds
	if !reflect.DeepEqual(got.Thresholds, map[string]any{"max_rmse": th.MaxRMSE, "min_snr_db": th.MinSNRDB, "min_cosine_similarity": th.MinCosine}) {
		t.Errorf("thresholds %v", got.Thresholds)
	}

	in := writeCache(t, t.TempDir())
	_, stdout, stderr = runCLI("metrics", "-input", in)
	var rep struct{ Thresholds map[string]any }
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err, stderr)
	}
	if !reflect.DeepEqual(rep.Thresholds, got.Thresholds) {
		t.Errorf("metrics thresholds %v, gates %v", rep.Thresholds, got.Thresholds)
	}
}
