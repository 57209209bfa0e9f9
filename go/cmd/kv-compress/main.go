// Command kv-compress compresses a KV cache saved as safetensors with one
// of the schemes engineers deploy (INT4 per-token groups by default; KIVI,
// asymmetric, rotated, outlier and residual variants; llama.cpp's ggml
// block types), restores it, and prints JSON quality metrics on stdout.
//
// Usage:
//
//	kv-compress compress   -input kv.safetensors -output kv.kvq.safetensors [-scheme int4] [-bits 4] [-group-size 64] [-sparsity 0] [-lossless]
//	kv-compress decompress -input kv.kvq.safetensors -output kv.restored.safetensors
//	kv-compress roundtrip  -input kv.safetensors -output kv.restored.safetensors [-scheme ...]
//	kv-compress metrics    -input kv.safetensors [-scheme ...]
//	kv-compress check      -scheme SPEC    (validate and print the canonical scheme)
//	kv-compress schemes                    (list the presets)
//	kv-compress schemes -engine llama.cpp  (an engine's KV-cache formats: llama.cpp:q4_0, ...)
//	kv-compress gates                      (the quality levels and default gates)
//	kv-compress serve                      (a long-lived codec: framed requests on stdin, see serve.go)
//
// Exit status: 0 success, 1 quality gates failed (output and JSON are still
// written), 2 bad usage or bad input (nothing is written).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kvlib/pkg/compression"
)

const (
	exitOK      = 0
	exitQuality = 1
	exitError   = 2
)

// stdin is what serve reads (tests replace it).
var stdin io.Reader = os.Stdin

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is bad usage: exit 2 with the message and no stack of context.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// run is kv-compress with the arguments args: it looks the command up in
// commands (compress when args start with a flag), runs it and prints its
// JSON, or one line on stderr, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "kv-compress: a command is required (kv-compress -h for usage)")
		return exitError
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		printUsage(stdout)
		return exitOK
	}
	name := "compress" // the design documents call the CLI with flags alone
	if !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	cmd := lookup(name)
	if cmd != nil && cmd.main != nil {
		return cmd.main(args, stdout, stderr)
	}
	rep, err := safeDispatch(cmd, name, args, stderr)
	if err == nil {
		var js []byte
		if js, err = encodeJSON(rep); err == nil {
			_, err = stdout.Write(js)
		}
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", " ") // one line, always
		var ue usageError
		if errors.As(err, &ue) {
			msg += " (kv-compress -h for usage)"
		}
		fmt.Fprintf(stderr, "kv-compress %s: %s\n", name, msg)
		return exitError
	}
	if r, ok := rep.(*compression.Report); ok && !r.Passed {
		return exitQuality
	}
	return exitOK
}

// encodeJSON is the JSON the CLI prints for a result.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // ">=" in violations, not "\u003e="
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encoding JSON: %v", err)
	}
	return buf.Bytes(), nil
}

type config struct {
	input, output string
	cfg           compression.Config
	verbose       bool
	engine        string    // schemes -engine: an engine's formats instead of the presets
	start         time.Time // when the command began, flags included
}

// schemeFlags are the flags that choose the scheme: -scheme, then -bits,
// -group-size and -sparsity applied to both roles where given.
type schemeFlags struct {
	scheme    string
	bits      int
	groupSize int
	sparsity  float64
	lossless  bool
}

func (sf *schemeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&sf.scheme, "scheme", compression.DefaultPreset, "preset name or scheme spec (see docs/kv-compress/schemes.md)")
	fs.IntVar(&sf.bits, "bits", 4, "code width in bits, 2 to 8 (sym/asym schemes; both roles)")
	fs.IntVar(&sf.groupSize, "group-size", 64, "elements per quantization group, positive and even (sym/asym schemes; both roles)")
	fs.Float64Var(&sf.sparsity, "sparsity", 0, "fraction in [0, 1) of smallest-magnitude elements zeroed per tensor before quantizing (both roles)")
	fs.BoolVar(&sf.lossless, "lossless", false, "add the lossless stage after the quantizer (same as the spec suffix +lossless)")
}

// spec resolves the flags into a validated Spec; set names the flags given.
func (sf *schemeFlags) spec(set map[string]bool) (compression.Spec, error) {
	s, err := compression.ParseSpec(sf.scheme)
	if err != nil {
		return s, err
	}
	var err2 error
	s.Schemes(func(sc *compression.Scheme) {
		if (set["bits"] || set["group-size"]) && sc.Method.IsGGML() {
			err2 = fmt.Errorf("-bits and -group-size do not apply to %s", sc.Method)
		}
		if set["bits"] {
			sc.Bits = sf.bits
		}
		if set["group-size"] {
			sc.Group = sf.groupSize
		}
		if set["sparsity"] {
			sc.Sparsity = sf.sparsity
		}
	})
	if err2 != nil {
		return s, err2
	}
	s.Lossless = s.Lossless || sf.lossless
	return s.Canonical(), s.Validate()
}

// parseFlags parses the flags of the groups given; an error is a
// usageError, or flag.ErrHelp after the flags' help went to stderr.
func parseFlags(cmd string, args []string, stderr io.Writer, groups flagGroup) (*config, error) {
	needInput, needOutput, quantizes := groups&inputFlag != 0, groups&outputFlag != 0, groups&quantizeFlags != 0
	fs := flag.NewFlagSet("kv-compress "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line from run, not a usage dump
	fs.Usage = func() {}
	c := &config{cfg: compression.DefaultConfig()}
	var sf schemeFlags
	if needInput {
		fs.StringVar(&c.input, "input", "", "input safetensors file (required)")
	}
	if needOutput {
		fs.StringVar(&c.output, "output", "", "output safetensors file (required)")
	}
	th := &c.cfg.Thresholds
	if quantizes {
		sf.register(fs)
		fs.Float64Var(&th.MaxRMSE, "max-rmse", th.MaxRMSE, "quality gate: RMSE must be below this")
		fs.Float64Var(&th.MinSNRDB, "min-snr", th.MinSNRDB, "quality gate: SNR in dB must be above this")
		fs.Float64Var(&th.MinCosine, "min-cosine", th.MinCosine, "quality gate: cosine similarity must be above this")
	}
	if groups&engineFlag != 0 {
		fs.StringVar(&c.engine, "engine", "", "list the KV-cache formats of an engine ("+strings.Join(compression.EngineNames(), ", ")+
			", or all) with the release each follows and its evidence level, instead of the presets")
	}
	if groups&runFlags != 0 {
		fs.IntVar(&c.cfg.Workers, "workers", 0, fmt.Sprintf("goroutines, 0 to %d (0: one per CPU)", compression.MaxWorkers))
		fs.BoolVar(&c.verbose, "verbose", false, "log progress on stderr")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "usage of kv-compress %s:\n", cmd)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, usageError{err.Error()}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case fs.NArg() > 0:
		return nil, usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	case needInput && c.input == "":
		return nil, usageError{"-input is required"}
	case needOutput && c.output == "":
		return nil, usageError{"-output is required"}
	case needOutput && sameFile(c.input, c.output):
		return nil, usageError{fmt.Sprintf("-output %s is the input file", c.output)}
	case c.cfg.Workers < 0 || c.cfg.Workers > compression.MaxWorkers:
		return nil, usageError{fmt.Sprintf("-workers %d out of range [0, %d]", c.cfg.Workers, compression.MaxWorkers)}
	}
	if quantizes {
		var err error
		if c.cfg.Spec, err = sf.spec(set); err != nil {
			return nil, usageError{err.Error()}
		}
		for name, v := range map[string]float64{"max-rmse": th.MaxRMSE, "min-snr": th.MinSNRDB, "min-cosine": th.MinCosine} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, usageError{fmt.Sprintf("-%s %g is not a finite number", name, v)}
			}
		}
	}
	return c, nil
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	if err1 == nil && err2 == nil {
		return os.SameFile(fa, fb)
	}
	return filepath.Clean(a) == filepath.Clean(b)
}

// safeDispatch is dispatch with a panic turned into an error: a bug must
// still end as one line and exit 2, not a stack trace.
func safeDispatch(cmd *command, name string, args []string, stderr io.Writer) (rep any, err error) {
	defer func() {
		if r := recover(); r != nil {
			rep, err = nil, fmt.Errorf("internal error: %v", r)
		}
	}()
	return dispatch(cmd, name, args, stderr)
}

// dispatch parses cmd's flags and runs it; cmd is nil when no command is
// called name.
func dispatch(cmd *command, name string, args []string, stderr io.Writer) (any, error) {
	start := time.Now()
	if cmd == nil {
		return nil, usageError{fmt.Sprintf("unknown command %q", name)}
	}
	c, err := parseFlags(cmd.name, args, stderr, cmd.flags)
	if err != nil {
		return nil, err
	}
	c.start = start
	return cmd.run(cmd.name, c, stderr)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
