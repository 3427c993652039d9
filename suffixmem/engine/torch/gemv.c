/* A bf16 matrix-vector product for decode steps of 1-4 rows (see gemv.py for the contract).
 *
 * y[m, n] = sum_k x[m, k] * w[n, k]: x [M, K] and w [N, K] bf16, row-major and contiguous;
 * fp32 accumulation (VDPBF16PS), y rounded once to bf16 (nearest even).
 *
 * Why not oneDNN: its one-row bf16 product reads the weights at about half the rate a plain
 * read gets on the 2-core hosts this project measures on (docs/profile-decode.md, round 7).
 * This kernel reads each thread's share of w strictly in address order, one output row at a
 * time, with a software prefetch a few rows ahead, which the hardware prefetchers follow;
 * out-of-order execution overlaps successive rows' dependency chains.
 *
 * Threads: one OpenMP parallel region per call, rows split evenly. Linked against libgomp by
 * soname, so inside torch's process it runs on torch's own OpenMP runtime and pool.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define PREFETCH_BYTES 4096 /* ahead of the row being read: measured 1,024 < 2,048 < 4,096 */

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays NaN (quiet) */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* rows n0 .. n1-1 of y for M (a compile-time constant after inlining) rows of x */
static inline __attribute__((always_inline)) void rows(
        const uint16_t *x, const uint16_t *w, uint16_t *y, int M, int N, int K, int n0, int n1) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *wr = w + (size_t)n * K;
        __m512 acc[4][2]; /* two chains per x row: half the dependency latency */
        for (int m = 0; m < M; m++) {
            acc[m][0] = _mm512_setzero_ps();
            acc[m][1] = _mm512_setzero_ps();
        }
        int k = 0;
        for (; k + 64 <= K; k += 64) {
            _mm_prefetch((const char *)(wr + k) + PREFETCH_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)(wr + k) + PREFETCH_BYTES + 64, _MM_HINT_T0);
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(wr + k);
            __m512bh w1 = (__m512bh)_mm512_loadu_si512(wr + k + 32);
            for (int m = 0; m < M; m++) {
                const uint16_t *xr = x + (size_t)m * K + k;
                acc[m][0] = _mm512_dpbf16_ps(acc[m][0], (__m512bh)_mm512_loadu_si512(xr), w0);
                acc[m][1] = _mm512_dpbf16_ps(acc[m][1], (__m512bh)_mm512_loadu_si512(xr + 32),
                                             w1);
            }
        }
        if (k < K) { /* K % 64 == 32 */
            _mm_prefetch((const char *)(wr + k) + PREFETCH_BYTES, _MM_HINT_T0);
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(wr + k);
            for (int m = 0; m < M; m++)
                acc[m][0] = _mm512_dpbf16_ps(
                    acc[m][0], (__m512bh)_mm512_loadu_si512(x + (size_t)m * K + k), w0);
        }
        for (int m = 0; m < M; m++)
            y[(size_t)m * N + n] = to_bf16(_mm512_reduce_add_ps(
                _mm512_add_ps(acc[m][0], acc[m][1])));
    }
}

#define GEMV(MM)                                                                              \
    static void gemv_##MM(const uint16_t *x, const uint16_t *w, uint16_t *y, int N, int K) { \
        _Pragma("omp parallel") {                                                           \
            int t = omp_get_thread_num(), nt = omp_get_num_threads();                       \
            rows(x, w, y, MM, N, K, (int)((long)N * t / nt), (int)((long)N * (t + 1) / nt)); \
        }                                                                                   \
    }
GEMV(1)
GEMV(2)
GEMV(3)
GEMV(4)

/* 0 on success; -1 (nothing written) for M outside 1..4 or K not a multiple of 32 */
int suffixmem_gemv_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, int M, int N, int K) {
    if (K <= 0 || K % 32 || N <= 0)
        return -1;
    switch (M) {
    case 1: gemv_1(x, w, y, N, K); return 0;
    case 2: gemv_2(x, w, y, N, K); return 0;
    case 3: gemv_3(x, w, y, N, K); return 0;
    case 4: gemv_4(x, w, y, N, K); return 0;
    }
    return -1;
}
