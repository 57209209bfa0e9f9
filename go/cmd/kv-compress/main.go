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
	"log"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kvlib/pkg/compression"
	"kvlib/pkg/safetensors"
)

const (
	exitOK      = 0
	exitQuality = 1
	exitError   = 2
)

const usage = `usage: kv-compress COMMAND -input FILE [-output FILE] [flags]

commands:
  compress    quantize and pack -input into the kvq layout at -output
  decompress  restore a kvq file at -input to its source dtypes at -output
  roundtrip   compress and restore in one go; -output is the restored cache
  metrics     compress in memory and print the metrics; writes nothing
  check       validate -scheme (and -bits, -group-size, -sparsity) and print it
  schemes     list the preset schemes
  serve       answer round-trip requests on stdin/stdout, tensors in shared memory (see serve.go)

-scheme takes a preset (int4 int8 asym4 kivi4 kivi2 rot4 q4_0 q4_1 q5_0
q5_1 q8_0) or a spec such as k=asym4/g64/channel,v=asym4/g64 (see README).

Each command prints one JSON object on stdout. Exit status: 0 success,
1 quality gates failed (output still written), 2 bad usage or bad input.
Run 'kv-compress COMMAND -h' for the flags.
`

// stdin is what serve reads (tests replace it).
var stdin io.Reader = os.Stdin

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is bad usage: exit 2 with the message and no stack of context.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "kv-compress: a command is required (kv-compress -h for usage)")
		return exitError
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	if args[0] == "serve" {
		if len(args) > 1 {
			fmt.Fprintf(stderr, "kv-compress serve: takes no flags (the schemes come with each request)\n")
			return exitError
		}
		return serve(stdin, stdout, stderr)
	}
	cmd := "compress" // the design documents call the CLI with flags alone
	if args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	rep, err := safeDispatch(cmd, args, stderr)
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
		fmt.Fprintf(stderr, "kv-compress %s: %s\n", cmd, msg)
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
	fs.StringVar(&sf.scheme, "scheme", compression.DefaultPreset, "preset name or scheme spec (see README)")
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

func parseFlags(cmd string, args []string, stderr io.Writer, needInput, needOutput, quantizes bool) (*config, error) {
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
	fs.IntVar(&c.cfg.Workers, "workers", 0, fmt.Sprintf("goroutines, 0 to %d (0: one per CPU)", compression.MaxWorkers))
	fs.BoolVar(&c.verbose, "verbose", false, "log progress on stderr")
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
func safeDispatch(cmd string, args []string, stderr io.Writer) (rep any, err error) {
	defer func() {
		if r := recover(); r != nil {
			rep, err = nil, fmt.Errorf("internal error: %v", r)
		}
	}()
	return dispatch(cmd, args, stderr)
}

// dispatch runs one command and returns what it prints: a
// *compression.Report, or for check and schemes a description of schemes.
func dispatch(cmd string, args []string, stderr io.Writer) (any, error) {
	start := time.Now()
	var (
		c   *config
		err error
	)
	switch cmd {
	case "compress", "roundtrip":
		c, err = parseFlags(cmd, args, stderr, true, true, true)
	case "metrics":
		c, err = parseFlags(cmd, args, stderr, true, false, true)
	case "decompress":
		c, err = parseFlags(cmd, args, stderr, true, true, false)
	case "check":
		c, err = parseFlags(cmd, args, stderr, false, false, true)
		if err != nil {
			return nil, err
		}
		return compression.SchemeReport(cmd, c.cfg.Spec), nil
	case "schemes":
		if _, err := parseFlags(cmd, args, stderr, false, false, false); err != nil {
			return nil, err
		}
		return compression.PresetsReport(), nil
	default:
		return nil, usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
	if err != nil {
		return nil, err
	}
	logf := func(format string, a ...any) {}
	if c.verbose {
		lg := log.New(stderr, "kv-compress: ", log.Lmicroseconds)
		logf = lg.Printf
	}

	logf("reading %s", c.input)
	src, err := safetensors.ReadFile(c.input)
	if err != nil {
		return nil, err
	}
	logf("read %d tensors", len(src.Tensors))

	var rep *compression.Report
	var toWrite *safetensors.File
	codecStart := time.Now()
	if cmd == "decompress" {
		restored, hdr, err := compression.Decompress(src, c.cfg.Workers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.input, err)
		}
		rep = compression.DecompressReport(src, restored, hdr)
		toWrite = restored
	} else {
		compress := compression.Measure // the reconstruction's bytes are only written by roundtrip
		if cmd == "roundtrip" {
			compress = compression.Compress
		}
		res, err := compress(src, c.cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.input, err)
		}
		rep = res.Report
		toWrite = res.Compressed
		if cmd == "roundtrip" {
			toWrite = res.Restored
		}
		if cmd == "metrics" {
			toWrite = nil
		}
	}
	rep.CodecTimeMS = ms(time.Since(codecStart))
	logf("codec done in %.1f ms: rmse %.6g, snr %.2f dB", rep.CodecTimeMS, float64(rep.RMSE), float64(rep.SNRDB))
	rep.Command, rep.Input = cmd, c.input
	if toWrite != nil {
		rep.Output = c.output
		// The report must encode before the output is committed: exit 2
		// always means nothing was written.
		if _, err := encodeJSON(rep); err != nil {
			return nil, err
		}
		if err := safetensors.WriteFile(c.output, toWrite); err != nil {
			return nil, err
		}
		logf("wrote %s", c.output)
	}
	rep.ProcessingTimeMS = ms(time.Since(start))
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
