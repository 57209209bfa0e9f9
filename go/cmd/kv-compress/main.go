// Command kv-compress compresses a KV cache saved as safetensors with
// per-group integer quantization (INT4 by default), restores it, and
// prints JSON quality metrics on stdout.
//
// Usage:
//
//	kv-compress compress   -input kv.safetensors -output kv.kvq.safetensors [-bits 4] [-group-size 64] [-sparsity 0]
//	kv-compress decompress -input kv.kvq.safetensors -output kv.restored.safetensors
//	kv-compress roundtrip  -input kv.safetensors -output kv.restored.safetensors
//	kv-compress metrics    -input kv.safetensors
//
// Exit status: 0 success, 1 quality gates failed (output and JSON are still
// written), 2 bad usage or bad input (nothing is written).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
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

Each command prints one JSON object on stdout. Exit status: 0 success,
1 quality gates failed (output still written), 2 bad usage or bad input.
Run 'kv-compress COMMAND -h' for the flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is bad usage: exit 2 with the message and no stack of context.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitError
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	cmd := "compress" // the design documents call the CLI with flags alone
	if args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	rep, err := dispatch(cmd, args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "kv-compress %s: %v\n", cmd, err)
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprint(stderr, usage)
		}
		return exitError
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // ">=" in violations, not "\u003e="
	if err := enc.Encode(rep); err != nil {
		fmt.Fprintf(stderr, "kv-compress %s: writing JSON: %v\n", cmd, err)
		return exitError
	}
	if !rep.Passed {
		return exitQuality
	}
	return exitOK
}

type config struct {
	input, output string
	opt           compression.Options
	verbose       bool
}

func parseFlags(cmd string, args []string, stderr io.Writer, needOutput, quantizes bool) (*config, error) {
	fs := flag.NewFlagSet("kv-compress "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{opt: compression.DefaultOptions()}
	fs.StringVar(&c.input, "input", "", "input safetensors file (required)")
	if needOutput {
		fs.StringVar(&c.output, "output", "", "output safetensors file (required)")
	}
	if quantizes {
		fs.IntVar(&c.opt.Bits, "bits", c.opt.Bits, "code width in bits, 2 to 8")
		fs.IntVar(&c.opt.GroupSize, "group-size", c.opt.GroupSize, "elements per quantization group (positive, even)")
		fs.Float64Var(&c.opt.Sparsity, "sparsity", 0, "fraction in [0, 1) of smallest-magnitude elements zeroed per tensor before quantizing")
		fs.Float64Var(&c.opt.Thresholds.MaxRMSE, "max-rmse", c.opt.Thresholds.MaxRMSE, "quality gate: RMSE must be below this")
		fs.Float64Var(&c.opt.Thresholds.MinSNRDB, "min-snr", c.opt.Thresholds.MinSNRDB, "quality gate: SNR in dB must be above this")
		fs.Float64Var(&c.opt.Thresholds.MinCosine, "min-cosine", c.opt.Thresholds.MinCosine, "quality gate: cosine similarity must be above this")
	}
	fs.IntVar(&c.opt.Workers, "workers", 0, "goroutines (0: one per CPU)")
	fs.BoolVar(&c.verbose, "verbose", false, "log progress on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if c.input == "" {
		return nil, usageError{"-input is required"}
	}
	if needOutput && c.output == "" {
		return nil, usageError{"-output is required"}
	}
	if needOutput && sameFile(c.input, c.output) {
		return nil, usageError{fmt.Sprintf("-output %s is the input file", c.output)}
	}
	if quantizes {
		if err := compression.CheckParams(c.opt.Bits, c.opt.GroupSize); err != nil {
			return nil, usageError{err.Error()}
		}
		if !(c.opt.Sparsity >= 0 && c.opt.Sparsity < 1) {
			return nil, usageError{fmt.Sprintf("-sparsity %g out of range [0, 1)", c.opt.Sparsity)}
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

func dispatch(cmd string, args []string, stderr io.Writer) (*compression.Report, error) {
	start := time.Now()
	var (
		c   *config
		err error
	)
	switch cmd {
	case "compress", "roundtrip":
		c, err = parseFlags(cmd, args, stderr, true, true)
	case "metrics":
		c, err = parseFlags(cmd, args, stderr, false, true)
	case "decompress":
		c, err = parseFlags(cmd, args, stderr, true, false)
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
		restored, hdr, err := compression.Decompress(src, c.opt.Workers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.input, err)
		}
		rep = decompressReport(src, restored, hdr)
		toWrite = restored
	} else {
		res, err := compression.Compress(src, c.opt, cmd == "roundtrip")
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
		if err := safetensors.WriteFile(c.output, toWrite); err != nil {
			return nil, err
		}
		rep.Output = c.output
		logf("wrote %s", c.output)
	}
	rep.ProcessingTimeMS = ms(time.Since(start))
	return rep, nil
}

// decompressReport describes a restore: sizes and settings; there is no
// original to measure against, so the quality fields are null.
func decompressReport(src, restored *safetensors.File, hdr *compression.Header) *compression.Report {
	rep := &compression.Report{
		Format: compression.FormatName, FormatVersion: compression.FormatVersion,
		Bits: hdr.Bits, GroupSize: hdr.GroupSize, Sparsity: hdr.Sparsity,
		NumTensors: len(restored.Tensors), Passed: true, Violations: []string{},
		Tensors: []compression.TensorReport{},
	}
	nan := compression.Float(math.NaN()) // nothing to measure against: null in JSON
	rep.Quality = compression.Quality{RMSE: nan, SNRDB: nan, CosineSimilarity: nan, MaxError: nan}
	for i := range restored.Tensors {
		rep.NumElements += int64(restored.Tensors[i].NumElements())
	}
	for i := range src.Tensors {
		rep.CompressedSizeBytes += int64(len(src.Tensors[i].Data))
	}
	rep.OriginalSizeBytes = 2 * rep.NumElements
	if rep.CompressedSizeBytes > 0 {
		rep.CompressionRatio = float64(rep.OriginalSizeBytes) / float64(rep.CompressedSizeBytes)
		rep.BitsPerElement = 8 * float64(rep.CompressedSizeBytes) / float64(max(rep.NumElements, 1))
	}
	rep.CompressedFileBytes, _ = safetensors.EncodedSize(src)
	for i := range restored.Tensors {
		rep.SourceSizeBytes += int64(len(restored.Tensors[i].Data))
	}
	return rep
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
