// Device mesh: the rank layout of a run and one communicator per mesh group, split once
// at start-up from any world Communicator (MPI now, NCCL later). Layout arithmetic lives in
// MeshLayout (pure, no communicator) so tests and other backends reuse it unchanged.
//
// Dense mesh, dims (dp_replicate R, dp_shard S, cp C, tp T), tp innermost:
//     rank = ((r*S + s)*C + c)*T + t
// Expert mesh over the same ranks, dims (dp_replicate R, efsdp F, ep E, etp U) with
// F = S*C*T / (E*U), ep contiguous and innermost but for etp:
//     rank = ((r*F + f)*E + e)*U + u
// so inside one dp_replicate block b = rank mod (S*C*T) = (f*E + e)*U + u. With etp == tp the
// etp group is exactly the tp group and ep is carved from dp_shard×cp (cp first); with etp == 1
// ep takes consecutive ranks: tp first, then cp, then dp_shard (ep ranks sit close together).
//
// Groups (a group is the set of ranks that differ only in the listed dims; a rank's index in a
// group, its coord(), is its position in rank order, which is the row-major index over those
// dims):
//   world                          all ranks
//   dp_replicate, dp_shard, cp, tp one dense dim each
//   fsdp = dp_shard×cp             dense parameter sharding
//   dp   = dp_replicate×dp_shard   data loading
//   loss = dp_replicate×dp_shard×cp  token counts for the loss
//   ep, efsdp, etp                 one expert dim each
//   edp  = dp_replicate×efsdp      expert gradient reduction
// Every group exists even when its degree is 1 (a communicator of size 1).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/mesh_group.h"
#include "meshtrain/parallel/parallel_dims.h"

namespace meshtrain {

class MeshLayout {
 public:
  // Validates a copy of `dims` (dims.world must be set).
  explicit MeshLayout(const ParallelDims& dims);

  struct Coords {
    int dp_replicate = 0, dp_shard = 0, cp = 0, tp = 0;  // dense mesh
    int efsdp = 0, ep = 0, etp = 0;                      // expert mesh (same dp_replicate)
  };

  const ParallelDims& dims() const { return dims_; }
  int world() const { return dims_.world; }
  Coords coords(int rank) const;
  int dense_rank(int dp_replicate, int dp_shard, int cp, int tp) const;
  int expert_rank(int dp_replicate, int efsdp, int ep, int etp) const;

  // "dp_shard×cp" for views, the dim's own name for a single dim.
  static std::string group_dims(MeshGroup group);
  int group_size(MeshGroup group) const;
  // Position of `rank` inside its group (row-major over the group's dims).
  int group_index(MeshGroup group, int rank) const;
  // Same value for exactly the ranks that share this group with `rank`.
  int group_color(MeshGroup group, int rank) const;
  // World ranks of the group containing `rank`, in group order.
  std::vector<int> group_ranks(MeshGroup group, int rank) const;

 private:
  ParallelDims dims_;
};

class DeviceMesh {
 public:
  // Collective over `world`: every rank builds the same mesh. dims.world == 0 takes the
  // communicator's size; any other value must equal it. Needs no GPU.
  DeviceMesh(Communicator& world, ParallelDims dims);
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  const ParallelDims& dims() const { return layout_.dims(); }
  const MeshLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  int world_size() const { return layout_.world(); }

  // The communicator of a group (see the header comment); each group's is named as the group.
  Communicator& comm(MeshGroup group) const;
  int coord(MeshGroup group) const;
  int size(MeshGroup group) const;
  // Multi-line table: every group's dims, size and this rank's coordinate.
  std::string describe() const;

 private:
  MeshLayout layout_;
  int rank_ = 0;
  std::array<std::unique_ptr<Communicator>, kNumMeshGroups> comms_;
};

}  // namespace meshtrain
