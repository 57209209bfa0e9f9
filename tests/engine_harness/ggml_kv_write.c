// The engine's own KV-cache write and read, on this machine's CPU: llama.cpp's
// libggml (llama-cpp-python 0.3.36 sdist, llama.cpp 0c1e57098, ggml 0.25.3),
// linked as a library, runs the graph llama.cpp builds for a cache write:
//
//   src/llama-graph.cpp:2883-2890   k_cur = llama_mul_mat_hadamard(k_cur, k_rot)  (when rotation is on)
//   src/llama-impl.h:57-76          reshape to rows of n, ggml_mul_mat(rot, x) + GGML_HINT_SRC0_IS_HADAMARD
//   src/llama-kv-cache.cpp:1336-1360 ggml_view_2d(k_cur, n_embd_gqa, n_tokens), ggml_set_rows(k, k_cur, k_idxs)
//
// and, for kvlib's reconstruction, the inverse: the type's to_float
// (dequantize_row_*), then the same Hadamard graph. No llama.cpp code is
// copied here: every number below is computed by libggml.
//
// usage: ggml_kv_write TYPE NROT HEAD_DIM N_HEAD N_TOKENS < f32 values (token-major:
//        [n_tokens][n_head][head_dim]) > cache bytes, then the restored f32 values
// TYPE is f16, q8_0, q5_1, q5_0, q4_1, q4_0 or iq4_nl; NROT 0 (no rotation) or the
// Hadamard size.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "ggml.h"
#include "ggml-cpu.h"

static enum ggml_type type_of(const char * s) {
    static const struct { const char * name; enum ggml_type t; } types[] = {
        {"f16", GGML_TYPE_F16}, {"q8_0", GGML_TYPE_Q8_0}, {"q5_1", GGML_TYPE_Q5_1}, {"q5_0", GGML_TYPE_Q5_0},
        {"q4_1", GGML_TYPE_Q4_1}, {"q4_0", GGML_TYPE_Q4_0}, {"iq4_nl", GGML_TYPE_IQ4_NL},
    };
    for (size_t i = 0; i < sizeof(types)/sizeof(types[0]); i++) {
        if (strcmp(s, types[i].name) == 0) return types[i].t;
    }
    fprintf(stderr, "unknown type %s\n", s);
    exit(2);
}

// The Hadamard matrix as llama.cpp fills it (src/llama-kv-cache.cpp:21-59); the
// CPU kernel ignores its values (ggml-cpu/ops.cpp:12256-12330), but it is set
// as the engine sets it.
static void gen_hadamard(float * data, int n) {
    data[0] = 1.0 / sqrtf(n);
    for (int s = 1; s < n; s *= 2) {
        for (int i = 0; i < s; i++) {
            for (int j = 0; j < s; j++) {
                const float val = data[i*n + j];
                data[(i + s)*n + j] = val;
                data[i*n + j + s] = val;
                data[(i + s)*n + j + s] = -val;
            }
        }
    }
}

// rotate returns the graph node llama_mul_mat_hadamard(cur, rot) (src/llama-impl.h:57-76).
static struct ggml_tensor * rotate(struct ggml_context * ctx, struct ggml_tensor * cur, struct ggml_tensor * rot) {
    const int64_t n = rot->ne[0];
    struct ggml_tensor * res = ggml_reshape_2d(ctx, cur, n, ggml_nelements(cur)/n);
    res = ggml_mul_mat(ctx, rot, res);
    ggml_mul_mat_set_hint(res, GGML_HINT_SRC0_IS_HADAMARD);
    return ggml_reshape_4d(ctx, res, cur->ne[0], cur->ne[1], cur->ne[2], cur->ne[3]);
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s TYPE NROT HEAD_DIM N_HEAD N_TOKENS\n", argv[0]);
        return 2;
    }
    const enum ggml_type type = type_of(argv[1]);
    const int nrot = atoi(argv[2]), head_dim = atoi(argv[3]), n_head = atoi(argv[4]), n_tokens = atoi(argv[5]);
    const int64_t n = (int64_t) head_dim * n_head * n_tokens, n_embd = (int64_t) head_dim * n_head;

    float * x = malloc(n * sizeof(float));
    if (fread(x, sizeof(float), n, stdin) != (size_t) n) {
        fprintf(stderr, "short input\n");
        return 2;
    }
    struct ggml_init_params params = { (size_t) n * 64 + (size_t) (nrot * nrot) * 8 + 64u * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(params);

    // The write: f32 K or V [head_dim, n_head, n_tokens] -> (rotation) -> set_rows.
    struct ggml_tensor * cur = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, n_head, n_tokens);
    memcpy(cur->data, x, n * sizeof(float));
    struct ggml_tensor * rot = NULL;
    if (nrot > 0) {
        rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, nrot, nrot);
        gen_hadamard((float *) rot->data, nrot);
        cur = rotate(ctx, cur, rot);
    }
    struct ggml_tensor * view = ggml_view_2d(ctx, cur, n_embd, n_tokens, cur->nb[2], 0);
    struct ggml_tensor * cache = ggml_new_tensor_2d(ctx, type, n_embd, n_tokens);
    struct ggml_tensor * idxs = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_tokens);
    for (int i = 0; i < n_tokens; i++) ((int64_t *) idxs->data)[i] = i;
    struct ggml_tensor * out = ggml_set_rows(ctx, cache, view, idxs);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        return 1;
    }
    fwrite(cache->data, 1, ggml_nbytes(cache), stdout);

    // The read: to_float, then the same rotation (its own inverse).
    struct ggml_tensor * deq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, n_head, n_tokens);
    ggml_get_type_traits(type)->to_float(cache->data, (float *) deq->data, n);
    struct ggml_tensor * back = deq;
    if (nrot > 0) {
        back = ggml_cont(ctx, rotate(ctx, deq, rot));
        struct ggml_cgraph * gb = ggml_new_graph(ctx);
        ggml_build_forward_expand(gb, back);
        if (ggml_graph_compute_with_ctx(ctx, gb, 1) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "compute failed\n");
            return 1;
        }
    }
    fwrite(back->data, sizeof(float), n, stdout);
    ggml_free(ctx);
    free(x);
    return 0;
}
