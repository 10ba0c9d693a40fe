// The padded expert exchange ([parallelism] expert_exchange = "padded"): the token exchange of a
// MoE layer without a host wait. Every rank sends each EP peer a block of a fixed number of rows
// (block_rows, planned on the host), and every local expert owns a slot of a fixed number of rows
// (slot_rows) in the local buffer, so all sizes the communicator and the grouped GEMMs take on the
// host are known when the graph is built; the valid counts stay on the device. Rows move by
// gathers through index maps computed on the device from the counts:
//
//   compact  [R, D]         this rank's rows by global expert (moe_permute, alignment 1)
//   blocks   [ep · S, D]    peer q's block: the rows of q's experts, expert by expert, then zeros
//   slots    [El · C, D]    local expert e's slot: its rows from peer 0, 1, ..., then zeros
//
// to the experts: compact -> blocks, all_to_all, blocks -> slots; back: slots -> blocks,
// all_to_all, blocks -> compact. The grouped GEMMs run over whole slots (the zero rows give zero
// outputs and gradients), which costs the padding's FLOPs instead of a host wait.
//
// A row that does not fit (a peer's block over S rows, an expert's slot over C) is dropped from
// that micro-batch and counted on the device (ep_padded_overflows). The trainer reads the count
// once per step, before the optimizer, and redoes an overflowed step with the synced exchange
// (host counts, dropless), so no result ever comes from a dropped row.
//
// The index rules are plain inline functions shared by the CPU kernels and the CUDA kernels
// (moe/cuda/padded_exchange.cu), so both backends compute the same maps.
#pragma once

#include <cstddef>
#include <cstdint>

#include "meshtrain/core/device.h"

#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace meshtrain {
class Stream;
}

namespace meshtrain::ops {

struct EpPaddedShape {
  int ep = 1;
  int64_t el = 0;            // local experts per rank (global experts E = ep · el)
  int64_t block_rows = 0;    // S: rows of one peer's block
  int64_t slot_rows = 0;     // C: rows of one local expert's slot
  int64_t compact_rows = 0;  // R: rows of the compact buffer
};

// Which buffer a map fills (the destination) from which (the source).
enum class EpRowMap { kCompactToBlocks, kBlocksToSlots, kSlotsToBlocks, kBlocksToCompact };

// Rows of the destination of `map`.
MT_HOST_DEVICE inline int64_t ep_padded_rows(EpRowMap map, const EpPaddedShape& s) {
  switch (map) {
    case EpRowMap::kCompactToBlocks:
    case EpRowMap::kSlotsToBlocks: return int64_t(s.ep) * s.block_rows;
    case EpRowMap::kBlocksToSlots: return s.el * s.slot_rows;
    default: return s.compact_rows;
  }
}

// Rows this rank sends peer q: the counts of q's experts in groups [2, ep·el].
MT_HOST_DEVICE inline int64_t ep_padded_rows_to_peer(const EpPaddedShape& s, const int32_t* groups,
                                                     int64_t q) {
  const int64_t E = int64_t(s.ep) * s.el;
  int64_t n = 0;
  for (int64_t e = 0; e < s.el; ++e) n += groups[E + q * s.el + e];
  return n;
}

// The source row of destination row `d`, or -1 for a zero row. groups [2, ep·el] int32: this
// rank's compact groups (row 0 start, row 1 count, by global expert); recv [ep, el] int32: the
// rows this rank receives per (peer, local expert), i.e. the rows it sends back to each peer.
MT_HOST_DEVICE inline int64_t ep_padded_source(EpRowMap map, const EpPaddedShape& s,
                                               const int32_t* groups, const int32_t* recv,
                                               int64_t d) {
  const int64_t S = s.block_rows, C = s.slot_rows;
  switch (map) {
    case EpRowMap::kCompactToBlocks: {  // block q row r <- q's experts' compact rows
      const int64_t q = d / S, r = d % S;
      return r < ep_padded_rows_to_peer(s, groups, q) ? int64_t(groups[q * s.el]) + r : -1;
    }
    case EpRowMap::kBlocksToCompact: {  // compact row d <- its expert's peer block
      for (int64_t q = 0; q < s.ep; ++q) {
        const int64_t base = groups[q * s.el], n = ep_padded_rows_to_peer(s, groups, q);
        if (d >= base && d < base + n) return d - base < S ? q * S + (d - base) : -1;
      }
      return -1;
    }
    case EpRowMap::kBlocksToSlots: {  // slot e row r <- peer q's block, after peers < q
      const int64_t e = d / C, r = d % C;
      int64_t before = 0;  // rows of expert e from peers before q
      for (int64_t q = 0; q < s.ep; ++q) {
        const int64_t n = recv[q * s.el + e];
        if (r < before + n) {
          int64_t at = r - before;  // row in q's block
          for (int64_t f = 0; f < e; ++f) at += recv[q * s.el + f];
          return at < S ? q * S + at : -1;
        }
        before += n;
      }
      return -1;
    }
    default: {  // kSlotsToBlocks: block q row r <- the slot row kBlocksToSlots put it in
      const int64_t q = d / S, r = d % S;
      int64_t at = 0;  // first row of expert e in q's block
      for (int64_t e = 0; e < s.el; ++e) {
        const int64_t n = recv[q * s.el + e];
        if (r < at + n) {
          int64_t row = r - at;
          for (int64_t p = 0; p < q; ++p) row += recv[p * s.el + e];
          return row < C ? e * C + row : -1;
        }
        at += n;
      }
      return -1;
    }
  }
}

// How many blocks and slots of this micro-batch hold more rows than they can: blocks this rank
// sends (from groups), blocks it receives and slots of its experts (from recv). 0 = nothing lost.
MT_HOST_DEVICE inline int64_t ep_padded_overflows(const EpPaddedShape& s, const int32_t* groups,
                                                  const int32_t* recv) {
  int64_t over = 0;
  for (int64_t q = 0; q < s.ep; ++q) {
    int64_t got = 0;
    for (int64_t e = 0; e < s.el; ++e) got += recv[q * s.el + e];
    over += (ep_padded_rows_to_peer(s, groups, q) > s.block_rows) + (got > s.block_rows);
  }
  for (int64_t e = 0; e < s.el; ++e) {
    int64_t n = 0;
    for (int64_t q = 0; q < s.ep; ++q) n += recv[q * s.el + e];
    over += n > s.slot_rows;
  }
  return over;
}

// The device work of the padded exchange, one table per backend (the CPU one in
// padded_exchange.cpp, the CUDA one in moe/cuda/padded_exchange.cu). Pointers are the backend's
// memory; work is enqueued on `stream`.
struct EpPaddedKernels {
  // idx[d] = ep_padded_source(map, ...) for every destination row d.
  void (*index)(EpRowMap map, const EpPaddedShape& s, const int32_t* groups, const int32_t* recv,
                int32_t* idx, Stream& stream) = nullptr;
  // dst row d = src row idx[d], or zeros where idx[d] < 0.
  void (*gather)(void* dst, const void* src, const int32_t* idx, int64_t rows, size_t row_bytes,
                 Stream& stream) = nullptr;
  // *counter += ep_padded_overflows(...) (a float32 scalar: the trainer all-reduces it).
  void (*count_overflows)(const EpPaddedShape& s, const int32_t* groups, const int32_t* recv,
                          float* counter, Stream& stream) = nullptr;
};

void register_ep_padded_kernels(DeviceType device, EpPaddedKernels kernels);
// The table of `device` (Error if that backend registered none).
const EpPaddedKernels& ep_padded_kernels(DeviceType device);

}  // namespace meshtrain::ops
