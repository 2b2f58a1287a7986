// The CUDA templates' tile structs and shared-memory functions checked at compile time against the
// template records' tables (attngen/schedules/template_*.py), which every CUDA build writes into its
// directory as attngen_tiles.h. Every translation unit of a build includes this file: a row that the
// C++ computes differently fails the build on that row's static_assert (the instantiation context names
// the row's values). The runtime planner and the build's shared-memory checks read the same records.
#pragma once
#include <cstddef>
#include <utility>

#include "attngen_tiles.h"
#include "decode.cuh"
#include "decode_tc.cuh"
#include "hopper_prefill.cuh"
#include "prefill_launch.cuh"

namespace attngen {
namespace tile_checks {

namespace tiles = attngen_gen::tiles;

// Stand-ins for what the shared-memory functions read of their instantiation types: sizeof(T), and
// V::kHasKeyTransform.
template <int Bytes>
struct Element {
  unsigned char bytes[Bytes];
};
template <bool KeyTransform>
struct Traits {
  static constexpr bool kHasKeyTransform = KeyTransform;
};

template <class Table, std::size_t N>
constexpr std::size_t rows_of(const Table (&)[N]) {
  return N;
}

template <int D, int G, bool K, int E, int Tokens, int Stages, int Threads, unsigned long long Smem>
constexpr bool decode_row() {
  static_assert(DecodeTile<D, G>::kTokens == Tokens, "DecodeTile<D, G>::kTokens differs from the decode record");
  static_assert(DecodeTile<D, G>::kStages == Stages, "DecodeTile<D, G>::kStages differs from the decode record");
  static_assert(DecodeTile<D, G>::kThreads == Threads, "DecodeTile<D, G>::kThreads differs from the decode record");
  static_assert(decode_smem_bytes<Traits<K>, Element<E>, D, G>() == Smem,
                "decode_smem_bytes differs from the decode record");
  return true;
}

template <std::size_t... I>
constexpr bool decode_rows(std::index_sequence<I...>) {
  constexpr auto& t = tiles::kDecode;
  return (decode_row<t[I].head_dim, t[I].group, t[I].key_transform, t[I].elem_bytes, t[I].tokens, t[I].stages,
                     t[I].threads, t[I].smem_bytes>() && ...);
}

// KVE: bytes of a K/V element (1: an fp8 cache, its own stage count and layout)
template <int D, int KVE, int Stages, int PairsHeads>
constexpr bool decode_tc_default_row() {
  static_assert(decode_tc_stages<D, KVE == 1>() == Stages, "decode_tc_stages<D, kFp8>() differs from the decode_tc record");
  static_assert(decode_tc_pairs_kv_heads<D, KVE == 1>() == (PairsHeads != 0),
                "decode_tc_pairs_kv_heads<D, kFp8>() differs from the decode_tc record");
  return true;
}

template <std::size_t... I>
constexpr bool decode_tc_default_rows(std::index_sequence<I...>) {
  constexpr auto& t = tiles::kDecodeTCStages;
  return (decode_tc_default_row<t[I].head_dim, t[I].kv_bytes, t[I].stages, t[I].pairs_kv_heads>() && ...);
}

// E: bytes of a query element (decode_tc_smem_bytes takes 16-bit queries), KVE: of a K/V element
template <int D, int S, int E, int KVE, int Keys, unsigned long long Smem>
constexpr bool decode_tc_row() {
  static_assert(E == 2, "decode_tc_smem_bytes<D, S>() is written for 16-bit queries");
  static_assert(DecodeTCTile<D, S>::kKeys == Keys, "DecodeTCTile<D, S>::kKeys differs from the decode_tc record");
  static_assert(DecodeTCTile<D, S>::kStages == S, "DecodeTCTile<D, S>::kStages differs from the decode_tc record");
  static_assert(decode_tc_smem_bytes<D, S, KVE == 1>() == Smem,
                "decode_tc_smem_bytes<D, S, kFp8>() differs from the decode_tc record");
  return true;
}

template <std::size_t... I>
constexpr bool decode_tc_rows(std::index_sequence<I...>) {
  constexpr auto& t = tiles::kDecodeTC;
  return (decode_tc_row<t[I].head_dim, t[I].stages, t[I].elem_bytes, t[I].kv_bytes, t[I].keys, t[I].smem_bytes>() &&
          ...);
}

// E: bytes of a query element, KVE: of a K/V element (smaller: staged fp8 K/V)
template <int D, bool Small, int MT, int E, int KVE, int Rows, int Keys, int Stages, unsigned long long Smem>
constexpr bool prefill_row() {
  using Tile = PrefillTile<D, Small, MT>;
  static_assert(Tile::kRows == Rows, "PrefillTile<D, Small, MT>::kRows differs from the prefill record");
  static_assert(Tile::kKeys == Keys, "PrefillTile<D, Small, MT>::kKeys differs from the prefill record");
  static_assert(Tile::kStages == Stages, "PrefillTile<D, Small, MT>::kStages differs from the prefill record");
  static_assert(prefill_smem_bytes<Traits<false>, Element<E>, D, Small, MT, Element<KVE>>() == Smem,
                "prefill_smem_bytes differs from the prefill record");
  return true;
}

template <std::size_t... I>
constexpr bool prefill_rows(std::index_sequence<I...>) {
  constexpr auto& t = tiles::kPrefill;
  return (prefill_row<t[I].head_dim, t[I].small, t[I].m_tiles, t[I].elem_bytes, t[I].kv_bytes, t[I].rows, t[I].keys,
                      t[I].stages, t[I].smem_bytes>() && ...);
}

static_assert(decode_rows(std::make_index_sequence<rows_of(tiles::kDecode)>()), "decode tiles");
static_assert(decode_tc_default_rows(std::make_index_sequence<rows_of(tiles::kDecodeTCStages)>()), "decode_tc stages");
static_assert(decode_tc_rows(std::make_index_sequence<rows_of(tiles::kDecodeTC)>()), "decode_tc tiles");
static_assert(prefill_rows(std::make_index_sequence<rows_of(tiles::kPrefill)>()), "prefill tiles");
static_assert(kPrefillWideRows == tiles::kPrefillWideRows, "kPrefillWideRows differs from the prefill record");

template <int D, int Wide, int E, int Rows, int Keys, int Stages, int Threads, unsigned long long Smem>
constexpr bool prefill_hopper_row() {
  using Tile = HopperTile<D, Wide != 0>;
  static_assert(Tile::kRows == Rows, "HopperTile<D, Wide>::kRows differs from the prefill_hopper record");
  static_assert(Tile::kKeys == Keys, "HopperTile<D, Wide>::kKeys differs from the prefill_hopper record");
  static_assert(Tile::kStages == Stages, "HopperTile<D, Wide>::kStages differs from the prefill_hopper record");
  static_assert(Tile::kThreads == Threads, "HopperTile<D, Wide>::kThreads differs from the prefill_hopper record");
  static_assert(hopper_prefill_smem_bytes<Element<E>, D, Wide != 0>() == Smem,
                "hopper_prefill_smem_bytes differs from the prefill_hopper record");
  return true;
}

template <std::size_t... I>
constexpr bool prefill_hopper_rows(std::index_sequence<I...>) {
  constexpr auto& t = tiles::kPrefillHopper;
  return (prefill_hopper_row<t[I].head_dim, t[I].wide, t[I].elem_bytes, t[I].rows, t[I].keys, t[I].stages,
                             t[I].threads, t[I].smem_bytes>() && ...);
}
static_assert(prefill_hopper_rows(std::make_index_sequence<rows_of(tiles::kPrefillHopper)>()), "prefill_hopper tiles");
static_assert(kHopperWideRows == tiles::kHopperWideRows, "kHopperWideRows differs from the prefill_hopper record");

}  // namespace tile_checks
}  // namespace attngen
