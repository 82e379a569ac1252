/* A software AMX for the tests of hosts without one: the tile intrinsics the AMX
   descriptions (polytile/isa/t*_amx.tc) print, as C functions on a thread's eight tiles,
   following the Intel SDM's pseudo-code (TILELOADD, TILESTORED, TDPBUSD, TDPBSSD,
   TDPBF16PS; bfloat16 products added one at a time in float32, without the hardware's
   flushing of denormals). Built into a kernel with `-include` and without the -mamx-*
   flags (tests/isa/amx.py). A tile used before the thread loaded a configuration, or
   after it released it, aborts: the kernel must set each of its threads up. */
#include <immintrin.h>     /* first: gcc declares the real intrinsics there */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#undef _tile_loadconfig
#undef _tile_release
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbusd
#undef _tile_dpbssd
#undef _tile_dpbf16ps

static __thread struct {
  int configured;
  unsigned rows[8], colsb[8];
  uint8_t data[8][16][64];
} pt_emu;

static void pt_emu_config(const void *config) {
  const uint8_t *c = (const uint8_t *)config;
  if (c[0] != 1) abort();                       /* palette 1 only */
  for (int t = 0; t < 8; t++) {
    pt_emu.colsb[t] = (unsigned)c[16 + 2 * t] | (unsigned)c[17 + 2 * t] << 8;
    pt_emu.rows[t] = c[48 + t];
    if (pt_emu.colsb[t] > 64 || pt_emu.rows[t] > 16) abort();
  }
  memset(pt_emu.data, 0, sizeof pt_emu.data);
  pt_emu.configured = 1;
}

static void pt_emu_tile(int t) {
  if (!pt_emu.configured || t < 0 || t > 7 || pt_emu.rows[t] == 0) abort();
}

static void pt_emu_load(int t, const void *base, long stride) {
  pt_emu_tile(t);
  memset(pt_emu.data[t], 0, sizeof pt_emu.data[t]);
  for (unsigned r = 0; r < pt_emu.rows[t]; r++)
    memcpy(pt_emu.data[t][r], (const char *)base + r * stride, pt_emu.colsb[t]);
}

static void pt_emu_store(int t, void *base, long stride) {
  pt_emu_tile(t);
  for (unsigned r = 0; r < pt_emu.rows[t]; r++)
    memcpy((char *)base + r * stride, pt_emu.data[t][r], pt_emu.colsb[t]);
}

/* C (rows x colsb/4 dwords) += A (rows x colsb/4 dwords) . B (colsb(A)/4 rows): each
   dword of C sums the products of the four bytes (or two bfloat16) of A's dword k and
   B's row k's dword n. */
static void pt_emu_dp(int c, int a, int b, int kind) {
  pt_emu_tile(c), pt_emu_tile(a), pt_emu_tile(b);
  for (unsigned m = 0; m < pt_emu.rows[c]; m++)
    for (unsigned k = 0; k < pt_emu.colsb[a] / 4; k++)
      for (unsigned n = 0; n < pt_emu.colsb[c] / 4; n++) {
        const uint8_t *x = &pt_emu.data[a][m][4 * k], *y = &pt_emu.data[b][k][4 * n];
        uint8_t *z = &pt_emu.data[c][m][4 * n];
        if (kind == 2) {
          float acc;
          memcpy(&acc, z, 4);
          for (int p = 0; p < 2; p++) {
            uint32_t xb = (uint32_t)(x[2 * p] | x[2 * p + 1] << 8) << 16;
            uint32_t yb = (uint32_t)(y[2 * p] | y[2 * p + 1] << 8) << 16;
            float xf, yf;
            memcpy(&xf, &xb, 4), memcpy(&yf, &yb, 4);
            acc += xf * yf;
          }
          memcpy(z, &acc, 4);
        } else {
          uint32_t acc;
          memcpy(&acc, z, 4);
          for (int p = 0; p < 4; p++)
            acc += (uint32_t)((kind == 0 ? (int32_t)x[p] : (int32_t)(int8_t)x[p])
                              * (int32_t)(int8_t)y[p]);
          memcpy(z, &acc, 4);
        }
      }
}

#define _tile_loadconfig(config) pt_emu_config(config)
#define _tile_release() ((void)(pt_emu.configured = 0))
#define _tile_loadd(t, base, stride) pt_emu_load((t), (base), (stride))
#define _tile_stored(t, base, stride) pt_emu_store((t), (base), (stride))
#define _tile_dpbusd(c, a, b) pt_emu_dp((c), (a), (b), 0)
#define _tile_dpbssd(c, a, b) pt_emu_dp((c), (a), (b), 1)
#define _tile_dpbf16ps(c, a, b) pt_emu_dp((c), (a), (b), 2)
