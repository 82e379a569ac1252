/* Two loop structures of an fp32 GEMM on AVX-512, written by hand, one thread: what a
   different blocking would buy over the one polytile generates (issue 13's tmm 1024^3).

       gcc -O3 -march=native -ffp-contract=fast benchmarks/gemm_structure.c \
           -o /tmp/gemm_structure && /tmp/gemm_structure [rounds]

   C (1024 x 1024) = A (1024 x 1024) B^T, B packed once into 32-column panels
   [n/32][k][32] as pass pack lays it out (not timed). Both structures run the same
   register-tile code (intrinsics; gcc keeps the accumulators in registers):

   polytile  6 x 64 tiles (6 broadcasts of A's rows, 4 vectors of two panels), the
             reduction in chunks of 256, 108-row blocks; for each chunk and block, the
             64-column tiles outer and the 6-row tiles inner, A read in place: what
             `polytile show tests/paper/tmm.tc --stage ir` prints for these sizes.
   blis      12 x 32 tiles (12 broadcasts, 2 vectors of one panel), the reduction in
             chunks of kc; A's rows packed per chunk into 12-row micro-panels [k][12]
             (timed), then for each block of nc columns, the 12-row tiles outer and
             the 32-column tiles inner: the A micro-panel stays in L1 while B's panels
             stream from L2 (BLIS's order, with the roles of A and B swapped).

   Prints the median and minimum of `rounds` alternating runs of each, and the FMA peak
   measured the same way (12 independent chains of vector multiply-adds). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N 1024

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *A, *B, *Bp, *Ap, *C;

/* C[r][j] (+)= sum_k a(r, k) * b(k, j): a(r, k) = a[r * ars + k * aks]; b's vector v of
   step k at b + k * 32 + (v / 2) * ps + (v % 2) * 16 (two vectors per 32-wide panel). */
#define TILE(MR, NV)                                                                   \
    static void tile_##MR##x##NV(int kc, const float *a, long ars, long aks,           \
                                 const float *b, long ps, float *c, int first) {       \
        __m512 acc[MR][NV];                                                            \
        for (int r = 0; r < MR; r++)                                                   \
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();              \
        for (int k = 0; k < kc; k++) {                                                 \
            __m512 bv[NV];                                                             \
            for (int v = 0; v < NV; v++)                                               \
                bv[v] = _mm512_load_ps(b + k * 32 + (v / 2) * ps + (v % 2) * 16);      \
            for (int r = 0; r < MR; r++) {                                             \
                __m512 av = _mm512_set1_ps(a[r * ars + k * aks]);                      \
                for (int v = 0; v < NV; v++)                                           \
                    acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);                 \
            }                                                                          \
        }                                                                              \
        for (int r = 0; r < MR; r++)                                                   \
            for (int v = 0; v < NV; v++) {                                             \
                float *p = c + (long)r * N + v * 16;                                   \
                _mm512_storeu_ps(p, first ? acc[r][v]                                  \
                                          : _mm512_add_ps(acc[r][v], _mm512_loadu_ps(p))); \
            }                                                                          \
    }
TILE(6, 4)
TILE(12, 2)

static const long PANEL = (long)N * 32;        /* floats per packed panel */

static void polytile_structure(void) {
    const int kc = 256, mc = 108;
    for (int k0 = 0; k0 < N; k0 += kc)
        for (int m0 = 0; m0 + 6 <= N; m0 += mc) {
            int rows = (m0 + mc > N ? N - m0 : mc) / 6 * 6;
            for (int j = 0; j < N / 64; j++)
                for (int t = 0; t < rows / 6; t++)
                    tile_6x4(kc, A + (long)(m0 + 6 * t) * N + k0, N, 1,
                             Bp + (long)(2 * j) * PANEL + (long)k0 * 32, PANEL,
                             C + (long)(m0 + 6 * t) * N + 64 * j, k0 == 0);
        }
}

static void blis_structure(int kc, int nc) {
    const int tiles = N / 12;
    for (int k0 = 0; k0 < N; k0 += kc) {
        for (int t = 0; t < tiles; t++)
            for (int r = 0; r < 12; r++) {
                const float *src = A + (long)(12 * t + r) * N + k0;
                float *dst = Ap + (long)t * kc * 12 + r;
                for (int k = 0; k < kc; k++) dst[k * 12] = src[k];
            }
        for (int n0 = 0; n0 < N; n0 += nc)
            for (int t = 0; t < tiles; t++)
                for (int j = n0 / 32; j < (n0 + nc) / 32; j++)
                    tile_12x2(kc, Ap + (long)t * kc * 12, 1, 12,
                              Bp + (long)j * PANEL + (long)k0 * 32, PANEL,
                              C + (long)(12 * t) * N + 32 * j, k0 == 0);
    }
}

static double peak(void) {
    __m512 a[12], m = _mm512_set1_ps(0.999f), d = _mm512_set1_ps(1e-4f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(i * 1e-3f);
    const long steps = 20000000;
    double t = now();
    for (long s = 0; s < steps; s++) {
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, d);
        __asm__ volatile("" : : "v"(a[0]), "v"(a[1]), "v"(a[2]), "v"(a[3]), "v"(a[4]),
                         "v"(a[5]), "v"(a[6]), "v"(a[7]), "v"(a[8]), "v"(a[9]), "v"(a[10]),
                         "v"(a[11]));
    }
    return steps * 12.0 * 32 / (now() - t) * 1e-9;
}

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    if (rounds < 1 || rounds > 200) rounds = 15;
    A = aligned_alloc(64, 4L * N * N);
    B = aligned_alloc(64, 4L * N * N);
    Bp = aligned_alloc(64, 4L * N * N);
    Ap = aligned_alloc(64, 4L * N * N);
    C = aligned_alloc(64, 4L * N * N);
    for (long i = 0; i < (long)N * N; i++) {
        A[i] = (float)(i % 7) - 3;
        B[i] = (float)(i % 5) - 2;
    }
    for (int p = 0; p < N / 32; p++)
        for (int k = 0; k < N; k++)
            for (int i = 0; i < 32; i++) Bp[p * PANEL + k * 32 + i] = B[(long)(p * 32 + i) * N + k];
    const char *names[3] = {"polytile 6x64 kc=256 mc=108", "blis 12x32 kc=256 nc=512",
                            "blis 12x32 kc=256 nc=256"};
    double *times = calloc(3 * (size_t)rounds, sizeof(double));
    double peak_before = peak();
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < 3; v++) {
            double t = now();
            if (v == 0) polytile_structure();
            else blis_structure(256, v == 1 ? 512 : 256);
            times[v * rounds + r] = now() - t;
        }
    double flops = 2.0 * N * N * N;
    for (int v = 0; v < 3; v++) {
        double *x = times + v * rounds;
        qsort(x, rounds, sizeof(double), by_value);
        /* the 12-row structure leaves C's last 4 rows (1024 = 85 x 12 + 4) undone */
        double done = v == 0 ? flops * (N / 6 * 6) / N : flops * (N / 12 * 12) / N;
        printf("%-30s median %6.2f ms (%5.1f GFLOP/s)  min %6.2f ms\n", names[v],
               x[rounds / 2] * 1e3, done / x[rounds / 2] * 1e-9, x[0] * 1e3);
    }
    printf("FMA peak (one thread): %.1f GFLOP/s before, %.1f after\n", peak_before, peak());
    return 0;
}
