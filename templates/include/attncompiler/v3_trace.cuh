// attncompiler/v3_trace.cuh -- phase timestamps of the v3 forward for benchmarks/v3_trace.py.
//
// Compiled in only with -DAC_V3_TRACE (the benchmark prepends the define to the generated source);
// otherwise every mark is an empty statement. Each mark is one %globaltimer read and a store by one
// thread into ac_v3_trace[tile * 16 + slot]; v3_fwd.cuh places them where no wgmma is in flight.
#pragma once

#ifdef AC_V3_TRACE
#ifndef AC_V3_TRACE_TILES
#define AC_V3_TRACE_TILES 8192
#endif
__device__ unsigned long long ac_v3_trace[AC_V3_TRACE_TILES * 16];
#define AC_TRACE(tile, slot, cond)                                                        \
  do {                                                                                    \
    unsigned long long ac_t_;                                                             \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ac_t_));                             \
    if ((cond) && (tile) < AC_V3_TRACE_TILES) ac_v3_trace[(tile) * 16 + (slot)] = ac_t_;   \
  } while (0)
#define AC_TRACE_VALUE(tile, slot, cond, value)                                                        \
  do {                                                                                                 \
    if ((cond) && (tile) < AC_V3_TRACE_TILES) ac_v3_trace[(tile) * 16 + (slot)] = (unsigned long long)(value); \
  } while (0)
#else
#define AC_TRACE(tile, slot, cond) do { } while (0)
#define AC_TRACE_VALUE(tile, slot, cond, value) do { } while (0)
#endif

namespace ac {

// The trace's tile index: the persistent grid's tile, else the CTA's.
template <bool kPersistent>
__device__ __forceinline__ int v3_trace_tile(int tile) {
  return kPersistent ? tile : (int)(ac_grid_bh() * gridDim.x + blockIdx.x);
}

// Trace slots (AC_V3_TRACE): 0 SM id, 1 CTA start, 2 Q landed (consumer 0), 3 first S done, 4 first
// softmax done, 5 main loop done, 6 last P V done, 7 consumer 0 epilogue done, 8 consumer 1 epilogue
// done, 9 visited K/V blocks, 10 producer issued the tile's first copy; inside consumer 0's
// epilogue: 11 LSE and 1/l done, 12 staged O written to shared memory, 13 past the warpgroup barrier; 14 the CTA
// (blockIdx.x) that ran the tile, plus one (0: unset).
enum : int { kTraceSm = 0, kTraceStart, kTraceQ, kTraceS0, kTraceSoftmax0, kTraceLoop, kTracePv, kTraceEpi0,
             kTraceEpi1, kTraceBlocks, kTraceIssue, kTraceEpiScale, kTraceEpiSts, kTraceEpiBar, kTraceCta };

}  // namespace ac
