package cpu

import (
	"os"
	"runtime"
	"strings"
	"testing"
)

// On Linux the kernel lists in /proc/cpuinfo the extensions it lets
// programs use (it drops avx512f where it does not save the ZMM state):
// CPUID and XGETBV must say the same.
func TestFeaturesAgreeWithTheKernel(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the kernel's list is read on linux/amd64")
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skip(err)
	}
	var flags map[string]bool
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			flags = map[string]bool{}
			for _, f := range strings.Fields(v) {
				flags[f] = true
			}
			break
		}
	}
	if flags == nil {
		t.Skip("no flags line in /proc/cpuinfo")
	}
	for name, got := range map[string]bool{"avx2": X86.AVX2, "f16c": X86.F16C, "fma": X86.FMA, "avx512f": X86.AVX512F} {
		if got != flags[name] {
			t.Errorf("%s: detected %v, the kernel lists %v", name, got, flags[name])
		}
	}
}
