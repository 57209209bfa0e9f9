package main

import (
	"fmt"
	"io"
	"log"
	"strings"
	"time"

	"kvlib/pkg/compression"
	"kvlib/pkg/safetensors"
)

// A command is one of kv-compress's commands, as cmd/go's base.Command is
// one of go's: the table below is both what run dispatches on and what
// -h lists, so the two cannot disagree.
type command struct {
	name  string
	short string    // the line -h shows
	flags flagGroup // the flags parseFlags registers
	// run does the work once the flags are parsed, and returns what is
	// printed as JSON.
	run func(name string, c *config, stderr io.Writer) (any, error)
	// main, when set, replaces flags and run: the command reads its own
	// arguments, writes its own output and returns the exit status.
	main func(args []string, stdout, stderr io.Writer) int
}

// flagGroup says which of the shared flags a command takes.
type flagGroup uint8

const (
	inputFlag     flagGroup = 1 << iota // -input, required
	outputFlag                          // -output, required, not the input
	quantizeFlags                       // -scheme, -bits, -group-size, -sparsity, -lossless and the gates
	runFlags                            // -workers and -verbose
	engineFlag                          // -engine (schemes)
)

// commands are kv-compress's commands, in the order -h lists them.
var commands = []*command{
	{name: "compress", short: "quantize and pack -input into the kvq layout at -output",
		flags: inputFlag | outputFlag | quantizeFlags | runFlags, run: fileCommand(compressFile)},
	{name: "decompress", short: "restore a kvq file at -input to its source dtypes at -output",
		flags: inputFlag | outputFlag | runFlags, run: fileCommand(decompressFile)},
	{name: "roundtrip", short: "compress and restore in one go; -output is the restored cache",
		flags: inputFlag | outputFlag | quantizeFlags | runFlags, run: fileCommand(roundtripFile)},
	{name: "metrics", short: "compress in memory and print the metrics; writes nothing",
		flags: inputFlag | quantizeFlags | runFlags, run: fileCommand(metricsFile)},
	{name: "check", short: "validate -scheme (and -bits, -group-size, -sparsity) and print it",
		flags: quantizeFlags | runFlags, run: func(name string, c *config, _ io.Writer) (any, error) {
			return compression.SchemeReport(name, c.cfg.Spec), nil
		}},
	{name: "schemes", short: "list the preset schemes",
		flags: runFlags | engineFlag, run: func(_ string, c *config, _ io.Writer) (any, error) {
			if c.engine != "" {
				rows, err := compression.EngineReport(c.engine)
				if err != nil {
					return nil, usageError{err.Error()}
				}
				return rows, nil
			}
			return compression.PresetsReport(), nil
		}},
	{name: "gates", short: "print the quality levels and the default quality gates",
		run: func(name string, _ *config, _ io.Writer) (any, error) {
			return compression.GatesReport(name), nil
		}},
	{name: "serve", short: "answer round-trip requests on stdin/stdout, tensors in shared memory (see serve.go)",
		main: func(args []string, stdout, stderr io.Writer) int {
			if len(args) > 0 {
				fmt.Fprintf(stderr, "kv-compress serve: takes no flags (the schemes come with each request)\n")
				return exitError
			}
			return serve(stdin, stdout, stderr)
		}},
}

// lookup returns the command called name, or nil.
func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// printUsage writes the -h text: every command of the table and every
// preset of the compression package.
func printUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: kv-compress COMMAND -input FILE [-output FILE] [flags]\n\ncommands:\n")
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, c.name, c.short)
	}
	b.WriteString("\n")
	b.WriteString(wrap("-scheme takes a preset ("+strings.Join(compression.PresetNames(), " ")+
		") or a spec such as k=asym4/g64/channel,v=asym4/g64 (see docs/kv-compress/schemes.md).", 72))
	b.WriteString(`
Each command prints one JSON object on stdout. Exit status: 0 success,
1 quality gates failed (output still written), 2 bad usage or bad input.
Run 'kv-compress COMMAND -h' for the flags.
`)
	io.WriteString(w, b.String())
}

// wrap breaks text into lines of at most width bytes at spaces (a longer
// word gets a line of its own), each ending in a newline.
func wrap(text string, width int) string {
	var b strings.Builder
	line := 0
	for _, word := range strings.Fields(text) {
		if line > 0 && line+1+len(word) > width {
			b.WriteString("\n")
			line = 0
		}
		if line > 0 {
			b.WriteString(" ")
			line++
		}
		b.WriteString(word)
		line += len(word)
	}
	b.WriteString("\n")
	return b.String()
}

// A fileFunc is the codec step of a command that reads a safetensors file:
// the report, and the file to write at -output (nil for none).
type fileFunc func(src *safetensors.File, c *config) (*compression.Report, *safetensors.File, error)

func compressFile(src *safetensors.File, c *config) (*compression.Report, *safetensors.File, error) {
	res, err := compression.Measure(src, c.cfg) // the reconstruction's bytes are only written by roundtrip
	if err != nil {
		return nil, nil, err
	}
	return res.Report, res.Compressed, nil
}

func roundtripFile(src *safetensors.File, c *config) (*compression.Report, *safetensors.File, error) {
	res, err := compression.Compress(src, c.cfg)
	if err != nil {
		return nil, nil, err
	}
	return res.Report, res.Restored, nil
}

func metricsFile(src *safetensors.File, c *config) (*compression.Report, *safetensors.File, error) {
	res, err := compression.Measure(src, c.cfg)
	if err != nil {
		return nil, nil, err
	}
	return res.Report, nil, nil
}

func decompressFile(src *safetensors.File, c *config) (*compression.Report, *safetensors.File, error) {
	restored, hdr, err := compression.Decompress(src, c.cfg.Workers)
	if err != nil {
		return nil, nil, err
	}
	return compression.DecompressReport(src, restored, hdr), restored, nil
}

// fileCommand is the run of a command that reads -input: it times the
// codec step, fills in the report's command and files, and writes the
// output only once the report is known to encode.
func fileCommand(step fileFunc) func(string, *config, io.Writer) (any, error) {
	return func(name string, c *config, stderr io.Writer) (any, error) {
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

		codecStart := time.Now()
		rep, toWrite, err := step(src, c)
		if err != nil {
			return nil, &safetensors.FileError{Path: c.input, Err: err}
		}
		rep.CodecTimeMS = ms(time.Since(codecStart))
		logf("codec done in %.1f ms: rmse %.6g, snr %.2f dB", rep.CodecTimeMS, float64(rep.RMSE), float64(rep.SNRDB))
		rep.Command, rep.Input = name, c.input
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
		rep.ProcessingTimeMS = ms(time.Since(c.start))
		return rep, nil
	}
}
