// The speculative step's per-step index ops on CPU, each one loop over the batch: the KV slot bookkeeping and the
// greedy tree verify SGLang's EAGLE v2 path runs every decode step (sage_plugin/runtimes/sglang/cpu_ops/cache_ops.py
// and tree_ops.py document every op's semantics; their torch paths, a handful to a few dozen index operators per
// call, are the oracles these loops follow element by element).
//
// Why a loop: a step's host work runs right after a forward that streamed the model's weights through the caches, so
// every torch operator of a few-element index op starts cold (a torch path of 6-10 operators costs 300-550 us there
// at 16 requests, against 30-100 us warm); one call that walks the batch costs a fraction of that.
//
// Index inputs are int32 or int64 CPU tensors (SGLang's kernels differ between versions); outputs are written in
// their own dtype (int32 or int64, contiguous).  Every index read from a tensor is bounds-checked: a bad index raises
// (as the torch path's indexing does) instead of writing outside a buffer.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

bool is_index(const at::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == at::kInt || t.scalar_type() == at::kLong);
}

// A read-only flat view of an int32 / int64 CPU tensor.
struct Ints {
  at::Tensor keep;
  const int32_t* i32 = nullptr;
  const int64_t* i64 = nullptr;
  int64_t n = 0;
  Ints(const at::Tensor& t, const char* name) {
    TORCH_CHECK(is_index(t), "spec_cache: ", name, " must be an int32 or int64 CPU tensor, got ", t.scalar_type());
    keep = t.is_contiguous() ? t : t.contiguous();
    n = keep.numel();
    if (keep.scalar_type() == at::kInt) {
      i32 = keep.data_ptr<int32_t>();
    } else {
      i64 = keep.data_ptr<int64_t>();
    }
  }
  int64_t operator[](int64_t k) const { return i32 != nullptr ? i32[k] : i64[k]; }
  int64_t at(int64_t k, const char* name) const {
    TORCH_CHECK(k >= 0 && k < n, "spec_cache: index ", k, " out of range for ", name, " of ", n, " entries");
    return (*this)[k];
  }
};

// A writable flat view of a contiguous int32 / int64 CPU tensor (writes land in the tensor itself).
struct OutInts {
  int32_t* i32 = nullptr;
  int64_t* i64 = nullptr;
  int64_t n = 0;
  const char* name;
  OutInts(const at::Tensor& t, const char* name_) : name(name_) {
    TORCH_CHECK(is_index(t), "spec_cache: ", name, " must be an int32 or int64 CPU tensor, got ", t.scalar_type());
    TORCH_CHECK(t.is_contiguous(), "spec_cache: ", name, " must be contiguous");
    n = t.numel();
    if (t.scalar_type() == at::kInt) {
      i32 = t.data_ptr<int32_t>();
    } else {
      i64 = t.data_ptr<int64_t>();
    }
  }
  void set(int64_t k, int64_t v) {
    TORCH_CHECK(k >= 0 && k < n, "spec_cache: index ", k, " out of range for ", name, " of ", n, " entries");
    if (i32 != nullptr) {
      i32[k] = static_cast<int32_t>(v);
    } else {
      i64[k] = v;
    }
  }
  int64_t get(int64_t k) const {
    TORCH_CHECK(k >= 0 && k < n, "spec_cache: index ", k, " out of range for ", name, " of ", n, " entries");
    return i32 != nullptr ? i32[k] : i64[k];
  }
};

// Calls f(flat table index, running offset) for every column c in [start[b], end[b]) of row rpi[b] of a table whose
// rows are pool_len wide, request after request: the ragged ranges both req_to_token ops walk.
template <typename F>
void each_range_slot(const at::Tensor& req_pool_indices, const at::Tensor& start_offset,
                     const at::Tensor& end_offset, int64_t pool_len, F&& f) {
  Ints rpi(req_pool_indices, "req_pool_indices"), start(start_offset, "start_offset"), end(end_offset, "end_offset");
  int64_t off = 0;
  for (int64_t b = 0; b < rpi.n; ++b) {
    const int64_t row = rpi[b] * pool_len;
    for (int64_t c = start.at(b, "start_offset"); c < end.at(b, "end_offset"); ++c) f(row + c, off++);
  }
}

// req_to_token[rpi[b], start[b]:end[b]] = out_cache_loc[off_b : off_b + len_b], off_b the running sum of the lengths.
void assign_req_to_token_pool(const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                              const at::Tensor& start_offset, const at::Tensor& end_offset,
                              const at::Tensor& out_cache_loc, int64_t pool_len) {
  Ints loc(out_cache_loc, "out_cache_loc");
  OutInts table(req_to_token, "req_to_token");
  each_range_slot(req_pool_indices, start_offset, end_offset, pool_len,
                  [&](int64_t slot, int64_t off) { table.set(slot, loc.at(off, "out_cache_loc")); });
}

// out_cache_loc starts with the concatenation over b of req_to_token[rpi[b], start[b]:end[b]].
void assign_extend_cache_locs(const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                              const at::Tensor& start_offset, const at::Tensor& end_offset,
                              const at::Tensor& out_cache_loc, int64_t pool_len) {
  Ints table(req_to_token, "req_to_token");
  OutInts out(out_cache_loc, "out_cache_loc");
  each_range_slot(req_pool_indices, start_offset, end_offset, pool_len,
                  [&](int64_t slot, int64_t off) { out.set(off, table.at(slot, "req_to_token")); });
}

// out_cache_loc[b * width + j] = req_to_token[rpi[b], seq_lens[b] + j], width = topk * num_steps.
void assign_draft_cache_locs_contiguous(const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                                        const at::Tensor& seq_lens, const at::Tensor& out_cache_loc,
                                        int64_t pool_len, int64_t topk, int64_t num_steps) {
  Ints rpi(req_pool_indices, "req_pool_indices"), seq(seq_lens, "seq_lens"), table(req_to_token, "req_to_token");
  OutInts out(out_cache_loc, "out_cache_loc");
  const int64_t width = topk * num_steps;
  TORCH_CHECK(out.n == rpi.n * width, "out_cache_loc has ", out.n, " entries, expected bs*topk*num_steps=",
              rpi.n * width);
  for (int64_t b = 0; b < rpi.n; ++b) {
    const int64_t first = rpi[b] * pool_len + seq.at(b, "seq_lens");
    for (int64_t j = 0; j < width; ++j) {
      out.set(b * width + j, table.at(first + j, "req_to_token"));
    }
  }
}

// bonus_tokens[b] = accept_tokens.flatten()[accept_stride * b + accept_lens[b] - 1].
void fill_bonus_tokens(const at::Tensor& accept_tokens, const at::Tensor& accept_lens, const at::Tensor& bonus_tokens,
                       int64_t accept_stride) {
  Ints tokens(accept_tokens, "accept_tokens"), lens(accept_lens, "accept_lens");
  OutInts bonus(bonus_tokens, "bonus_tokens");
  for (int64_t b = 0; b < lens.n; ++b) {
    bonus.set(b, tokens.at(accept_stride * b + lens[b] - 1, "accept_tokens"));
  }
}

// accept_out_cache_loc[:n] = out_cache_loc[a[a != -1]], a the first `size` (default all) entries of accept_index.
void fill_accept_out_cache_loc(const at::Tensor& accept_index, const at::Tensor& out_cache_loc,
                               const at::Tensor& accept_out_cache_loc, std::optional<int64_t> size) {
  Ints index(accept_index, "accept_index"), loc(out_cache_loc, "out_cache_loc");
  OutInts out(accept_out_cache_loc, "accept_out_cache_loc");
  const int64_t n = size.has_value() ? std::min(std::max(*size, int64_t{0}), index.n) : index.n;
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = index[i];
    if (a != -1) {
      out.set(k++, loc.at(a, "out_cache_loc"));
    }
  }
}

// [bs * topk, pool_len] in req_to_token's dtype: row b * topk + k is req_to_token's row rpi[b] with columns
// s .. s + num_steps - 1 (s = seq_lens[b], below pool_len) taken from column min(col + k * num_steps, pool_len - 1).
template <typename T>
void draft_rows(const T* table, int64_t numel, T* out, const Ints& rpi, const Ints& seq, int64_t topk,
                int64_t num_steps, int64_t pool_len) {
  for (int64_t b = 0; b < rpi.n; ++b) {
    const int64_t row = rpi[b] * pool_len;
    const int64_t s = seq.at(b, "seq_lens");
    TORCH_CHECK(row >= 0, "spec_cache: req_pool_indices[", b, "] is negative");
    for (int64_t k = 0; k < topk; ++k) {
      T* dst = out + (b * topk + k) * pool_len;
      if (row + pool_len <= numel) {
        std::memcpy(dst, table + row, sizeof(T) * pool_len);
      } else {  // the torch path clamps every flat index to the table's last entry
        for (int64_t c = 0; c < pool_len; ++c) dst[c] = table[std::min(row + c, numel - 1)];
      }
      for (int64_t c = std::max(s, int64_t{0}); c < std::min(s + num_steps, pool_len); ++c) {
        dst[c] = table[std::min(row + std::min(c + k * num_steps, pool_len - 1), numel - 1)];
      }
    }
  }
}

at::Tensor build_draft_decode_metadata(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                       const at::Tensor& seq_lens, int64_t topk, int64_t num_steps,
                                       int64_t pool_len) {
  Ints rpi(req_pool_indices, "req_pool_indices"), seq(seq_lens, "seq_lens");
  TORCH_CHECK(is_index(req_to_token) && req_to_token.is_contiguous() && req_to_token.numel() > 0,
              "spec_cache: req_to_token must be a non-empty contiguous int32 or int64 CPU tensor");
  at::Tensor out = at::empty({rpi.n * topk, pool_len}, req_to_token.options());
  const int64_t numel = req_to_token.numel();
  if (req_to_token.scalar_type() == at::kInt) {
    draft_rows(req_to_token.data_ptr<int32_t>(), numel, out.data_ptr<int32_t>(), rpi, seq, topk, num_steps, pool_len);
  } else {
    draft_rows(req_to_token.data_ptr<int64_t>(), numel, out.data_ptr<int64_t>(), rpi, seq, topk, num_steps, pool_len);
  }
  return out;
}

// Greedy tree verification (cpu_ops/tree_ops.py, verify_tree_greedy_cpu): from each request's root, for up to S - 1
// levels, accept the first child in sibling order whose candidate equals the target's token after the last accepted
// node; accept_index[b, :tau + 1] gets the path's global ids, accept_token_num[b] = tau, predicts[g] = target[g] on
// the path.  A sibling list is followed for at most N entries (the torch path's bound).
void verify_tree_greedy(const at::Tensor& predicts, const at::Tensor& accept_index, const at::Tensor& accept_token_num,
                        const at::Tensor& candidates, const at::Tensor& retrive_index,
                        const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
                        const at::Tensor& target_predict) {
  TORCH_CHECK(candidates.dim() == 2 && accept_index.dim() == 2, "spec_cache: candidates and accept_index are 2-D");
  const int64_t bs = candidates.size(0), n = candidates.size(1), steps = accept_index.size(1);
  Ints cand(candidates, "candidates"), ri(retrive_index, "retrive_index"), target(target_predict, "target_predict");
  Ints nt(retrive_next_token, "retrive_next_token"), ns(retrive_next_sibling, "retrive_next_sibling");
  TORCH_CHECK(ri.n >= bs * n && nt.n >= bs * n && ns.n >= bs * n, "spec_cache: retrieve lists of ", bs * n,
              " entries expected");
  OutInts pred(predicts, "predicts"), index(accept_index, "accept_index"), num(accept_token_num, "accept_token_num");
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t base = b * n;
    int64_t node = 0, taken = 0;
    for (int64_t j = 0; j < steps; ++j) {
      if (j > 0) {  // the matching child of `node`, if any
        const int64_t want = target.at(ri[base + node], "target_predict");
        int64_t match = -1;
        for (int64_t child = nt[base + node], hops = 0; child >= 0 && hops < n; child = ns[base + child], ++hops) {
          TORCH_CHECK(child < n, "spec_cache: retrieve link ", child, " past the ", n, " nodes");
          if (cand[base + child] == want) {
            match = child;
            break;
          }
        }
        if (match < 0) break;
        node = match;
      }
      const int64_t g = ri[base + node];
      if (g >= 0) {
        index.set(b * steps + j, g);
        pred.set(g, target.at(g, "target_predict"));
        ++taken;
      }
    }
    num.set(b, taken - 1);
  }
}

// EAGLE draft tree -> verify mask, positions and first-child / next-sibling lists (cpu_ops/tree_ops.py,
// build_tree_kernel_efficient_cpu, whose docstring gives the mask modes): per request, node i >= 1 is candidate
// selected_index[b, i - 1], a child of the root if that id / topk == 0, else of the first node whose id equals
// parent_list[b, id / topk] (-2, unlinked, where none does).  Ancestor walks take at most N hops (the torch path's
// bound).
void build_tree_kernel_efficient(const at::Tensor& parent_list, const at::Tensor& selected_index,
                                 const at::Tensor& verified_seq_len, const at::Tensor& tree_mask,
                                 const at::Tensor& positions, const at::Tensor& retrive_index,
                                 const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
                                 int64_t topk, int64_t depth, int64_t draft_token_num, int64_t tree_mask_mode) {
  (void)depth;  // the walk is not cut at `depth` hops (the C++ CPU kernel's behaviour)
  const int64_t n = draft_token_num;
  Ints seq(verified_seq_len, "verified_seq_len"), sel(selected_index, "selected_index");
  Ints plist(parent_list, "parent_list");
  const int64_t bs = seq.n;
  TORCH_CHECK(n >= 1 && topk >= 1, "spec_cache: draft_token_num and topk must be positive");
  const int64_t sel_cols = bs > 0 ? sel.n / bs : 0, plist_cols = bs > 0 ? plist.n / bs : 0;
  TORCH_CHECK(n == 1 || sel_cols >= n - 1, "spec_cache: selected_index holds ", sel_cols, " ids a request, ",
              n - 1, " needed");
  OutInts pos(positions, "positions"), ri(retrive_index, "retrive_index"), nt(retrive_next_token, "retrive_next_token");
  OutInts ns(retrive_next_sibling, "retrive_next_sibling");
  TORCH_CHECK(tree_mask.device().is_cpu() && tree_mask.is_contiguous(), "spec_cache: tree_mask must be contiguous");
  const int64_t item = tree_mask.element_size();
  if (tree_mask_mode == 2) {
    TORCH_CHECK(item * 8 >= n, "QLEN_ONLY_BITPACKING: ", item, "-byte items cannot hold ", n, " columns");
  } else {
    TORCH_CHECK(tree_mask_mode == 0 || tree_mask_mode == 1, "unknown tree_mask_mode ", tree_mask_mode);
    TORCH_CHECK(tree_mask.scalar_type() == at::kBool, "spec_cache: tree_mask must be bool in mode ", tree_mask_mode);
  }
  uint8_t* mask = static_cast<uint8_t*>(tree_mask.data_ptr());  // bool is one byte
  const int64_t mask_bytes = tree_mask.numel() * item;
  std::vector<int64_t> parent(n);
  std::vector<uint8_t> rows(n * n);
  int64_t prefix = 0;  // sum of the earlier requests' seq_len (FULL_MASK's layout)
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t s = seq[b];
    parent[0] = -1;
    for (int64_t i = 1; i < n; ++i) {
      const int64_t id = sel[b * sel_cols + i - 1];
      const int64_t group = id >= 0 ? id / topk : -((-id + topk - 1) / topk);  // floor division
      int64_t p = -2;
      if (group == 0) {
        p = 0;
      } else if (group >= 1 && group < plist_cols) {
        const int64_t want = plist[b * plist_cols + group];
        for (int64_t j = 0; j < n - 1; ++j) {
          if (sel[b * sel_cols + j] == want) {
            p = j + 1;
            break;
          }
        }
      }
      parent[i] = p;
    }
    std::fill(rows.begin(), rows.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      uint8_t* row = rows.data() + i * n;
      row[0] = row[i] = 1;
      int64_t hop = parent[i];
      for (int64_t hops = 0; hop > 0 && hops < n; ++hops) {
        row[hop] = 1;
        hop = parent[hop];
      }
      int64_t depth_of = 0;
      for (int64_t j = 1; j < n; ++j) depth_of += row[j];
      ri.set(b * n + i, b * n + i);
      pos.set(b * n + i, s + depth_of);
      int64_t first = -1, next = -1;
      for (int64_t c = 0; c < n && first < 0; ++c) {
        if (parent[c] == i) first = c;
      }
      for (int64_t j = i + 1; j < n && next < 0 && parent[i] >= 0; ++j) {
        if (parent[j] == parent[i]) next = j;
      }
      if (first >= 0) nt.set(b * n + i, first);
      if (next >= 0) ns.set(b * n + i, next);
      if (tree_mask_mode == 2) {  // little-endian row bit sets, bit j = column j
        uint64_t bits = 0;
        for (int64_t j = 0; j < n; ++j) bits |= static_cast<uint64_t>(row[j]) << j;
        const int64_t at = (b * n + i) * item;
        TORCH_CHECK(at + item <= mask_bytes, "spec_cache: tree_mask holds ", mask_bytes, " bytes, too few");
        for (int64_t k = 0; k < item; ++k) mask[at + k] = static_cast<uint8_t>((bits >> (8 * k)) & 0xFF);
      } else {
        const int64_t at = tree_mask_mode == 1 ? (b * n + i) * n : b * n * n + prefix * n + i * (s + n) + s;
        TORCH_CHECK(at >= 0 && at + n <= mask_bytes, "spec_cache: tree_mask holds ", mask_bytes, " cells, too few");
        std::memcpy(mask + at, row, n);
      }
    }
    prefix += s;
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sage_plugin, m) {
  m.def("assign_req_to_token_pool(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()");
  m.def("assign_extend_cache_locs(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()");
  m.def("assign_draft_cache_locs_contiguous(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
        "Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps) -> ()");
  m.def("fill_bonus_tokens(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, "
        "int accept_stride) -> ()");
  m.def("fill_accept_out_cache_loc(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc, "
        "int? size=None) -> ()");
  m.def("verify_tree_greedy(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
        "Tensor target_predict) -> ()");
  m.def("build_tree_kernel_efficient(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
        "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()");
  m.def("build_draft_decode_metadata(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, "
        "int num_steps, int pool_len) -> Tensor");
}

TORCH_LIBRARY_IMPL(sage_plugin, CPU, m) {
  m.impl("assign_req_to_token_pool", &assign_req_to_token_pool);
  m.impl("assign_extend_cache_locs", &assign_extend_cache_locs);
  m.impl("assign_draft_cache_locs_contiguous", &assign_draft_cache_locs_contiguous);
  m.impl("fill_bonus_tokens", &fill_bonus_tokens);
  m.impl("fill_accept_out_cache_loc", &fill_accept_out_cache_loc);
  m.impl("build_draft_decode_metadata", &build_draft_decode_metadata);
  m.impl("verify_tree_greedy", &verify_tree_greedy);
  m.impl("build_tree_kernel_efficient", &build_tree_kernel_efficient);
}
