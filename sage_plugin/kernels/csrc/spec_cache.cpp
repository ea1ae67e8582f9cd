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

// req_to_token[rpi[b], start[b]:end[b]] = out_cache_loc[off_b : off_b + len_b], off_b the running sum of the lengths.
void assign_req_to_token_pool(const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                              const at::Tensor& start_offset, const at::Tensor& end_offset,
                              const at::Tensor& out_cache_loc, int64_t pool_len) {
  Ints rpi(req_pool_indices, "req_pool_indices"), start(start_offset, "start_offset"), end(end_offset, "end_offset");
  Ints loc(out_cache_loc, "out_cache_loc");
  OutInts table(req_to_token, "req_to_token");
  int64_t off = 0;
  for (int64_t b = 0; b < rpi.n; ++b) {
    const int64_t row = rpi[b] * pool_len;
    for (int64_t c = start.at(b, "start_offset"); c < end.at(b, "end_offset"); ++c) {
      table.set(row + c, loc.at(off++, "out_cache_loc"));
    }
  }
}

// out_cache_loc starts with the concatenation over b of req_to_token[rpi[b], start[b]:end[b]].
void assign_extend_cache_locs(const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                              const at::Tensor& start_offset, const at::Tensor& end_offset,
                              const at::Tensor& out_cache_loc, int64_t pool_len) {
  Ints rpi(req_pool_indices, "req_pool_indices"), start(start_offset, "start_offset"), end(end_offset, "end_offset");
  Ints table(req_to_token, "req_to_token");
  OutInts out(out_cache_loc, "out_cache_loc");
  int64_t off = 0;
  for (int64_t b = 0; b < rpi.n; ++b) {
    const int64_t row = rpi[b] * pool_len;
    for (int64_t c = start.at(b, "start_offset"); c < end.at(b, "end_offset"); ++c) {
      out.set(off++, table.at(row + c, "req_to_token"));
    }
  }
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
        int64_t child = nt[base + node];
        for (int64_t hops = 0; child >= 0 && hops < n; ++hops) {
          TORCH_CHECK(child < n, "spec_cache: retrieve link ", child, " past the ", n, " nodes");
          if (cand[base + child] == want) break;
          child = ns[base + child];
        }
        if (child < 0 || cand[base + std::min(child, n - 1)] != want) break;
        node = child;
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(sage_plugin, m) {
  m.def("assign_req_to_token_pool(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()");
  m.def("assign_extend_cache_locs(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()");
  m.def("assign_draft_cache_locs_contiguous(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
        "Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps) -> ()");
  m.def("fill_bonus_tokens(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride) -> ()");
  m.def("fill_accept_out_cache_loc(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc, "
        "int? size=None) -> ()");
  m.def("verify_tree_greedy(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
        "Tensor target_predict) -> ()");
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
}
