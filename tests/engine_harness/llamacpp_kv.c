// The driver of llama.cpp's own C (ggml_base_excerpt.c, ggml_cpu_excerpt.c: verbatim excerpts of
// llama.cpp 0c1e57098 / ggml 0.25.3 as the llama-cpp-python 0.3.36 sdist vendors it), for
// tests/test_engine_formats.py. It writes a KV cache as the engine's CPU build does and reads it back:
//
//   llamacpp_kv FORMAT NROT N < N float32 values > the cache bytes, then N float32 values
//
// FORMAT is f16, q8_0 (the x86 quantize_row_q8_0 that set_rows runs), q8_0_ref
// (quantize_row_q8_0_ref, for comparison), q5_1, q5_0, q4_1, q4_0 or iq4_nl. NROT is the Hadamard
// size (0: none): the values are rotated in runs of NROT by the engine's CPU kernel (fwht_rows)
// before the write, as src/llama-graph.cpp:2883-2890 does, and the read (the type's to_float) is
// rotated back by the same kernel, as kvlib restores a cache. The N values are quantized as one row
// (blocks of 32 in order), which is how set_rows quantizes each token's row of heads.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ggml_base_excerpt.c
void quantize_row_q4_0_ref(const float * x, void * y, int64_t k);
void quantize_row_q4_1_ref(const float * x, void * y, int64_t k);
void quantize_row_q5_0_ref(const float * x, void * y, int64_t k);
void quantize_row_q5_1_ref(const float * x, void * y, int64_t k);
void quantize_row_q8_0_ref(const float * x, void * y, int64_t k);
void quantize_row_iq4_nl_ref(const float * x, void * y, int64_t k);
void dequantize_row_q4_0(const void * x, float * y, int64_t k);
void dequantize_row_q4_1(const void * x, float * y, int64_t k);
void dequantize_row_q5_0(const void * x, float * y, int64_t k);
void dequantize_row_q5_1(const void * x, float * y, int64_t k);
void dequantize_row_q8_0(const void * x, float * y, int64_t k);
void dequantize_row_iq4_nl(const void * x, float * y, int64_t k);
void ggml_fp16_to_fp32_row(const uint16_t * x, float * y, int64_t n);
// ggml_cpu_excerpt.c
void quantize_row_q8_0(const float * x, void * y, int64_t k);
void ggml_cpu_fp32_to_fp16(const float * x, uint16_t * y, int64_t n);
void fwht_rows(const float * src, float * dst, int64_t n, int64_t nr);

typedef void (*quantize_fn)(const float *, void *, int64_t);
typedef void (*dequantize_fn)(const void *, float *, int64_t);

static void f16_write(const float * x, void * y, int64_t k) { ggml_cpu_fp32_to_fp16(x, (uint16_t *) y, k); }
static void f16_read(const void * x, float * y, int64_t k) { ggml_fp16_to_fp32_row((const uint16_t *) x, y, k); }

static const struct {
    const char * name;
    int elems, bytes;
    quantize_fn quantize;
    dequantize_fn dequantize;
} formats[] = {
    {"f16", 1, 2, f16_write, f16_read},
    {"q8_0", 32, 34, quantize_row_q8_0, dequantize_row_q8_0},
    {"q8_0_ref", 32, 34, quantize_row_q8_0_ref, dequantize_row_q8_0},
    {"q5_1", 32, 24, quantize_row_q5_1_ref, dequantize_row_q5_1},
    {"q5_0", 32, 22, quantize_row_q5_0_ref, dequantize_row_q5_0},
    {"q4_1", 32, 20, quantize_row_q4_1_ref, dequantize_row_q4_1},
    {"q4_0", 32, 18, quantize_row_q4_0_ref, dequantize_row_q4_0},
    {"iq4_nl", 32, 18, quantize_row_iq4_nl_ref, dequantize_row_iq4_nl},
};

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s FORMAT NROT N\n", argv[0]);
        return 2;
    }
    int f = -1;
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++) {
        if (strcmp(argv[1], formats[i].name) == 0) f = (int) i;
    }
    const int64_t nrot = atoll(argv[2]), n = atoll(argv[3]);
    if (f < 0 || n <= 0 || n % formats[f].elems || (nrot && (nrot & (nrot - 1) || n % nrot))) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    const size_t nbytes = (size_t) (n / formats[f].elems * formats[f].bytes);
    float * x = malloc(n * sizeof(float)), * r = malloc(n * sizeof(float)), * y = malloc(n * sizeof(float));
    uint8_t * q = calloc(nbytes, 1);
    if (fread(x, sizeof(float), n, stdin) != (size_t) n) {
        fprintf(stderr, "short input\n");
        return 2;
    }
    if (nrot) {
        fwht_rows(x, r, nrot, n / nrot);
    } else {
        memcpy(r, x, n * sizeof(float));
    }
    formats[f].quantize(r, q, n);
    formats[f].dequantize(q, y, n);
    if (nrot) {
        fwht_rows(y, r, nrot, n / nrot);
        memcpy(y, r, n * sizeof(float));
    }
    fwrite(q, 1, nbytes, stdout);
    fwrite(y, sizeof(float), n, stdout);
    free(x), free(r), free(y), free(q);
    return 0;
}
