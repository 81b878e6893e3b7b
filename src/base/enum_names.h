// An enum's names from one table: the name of a value, the value of a name, and the list of
// names for an error message. Each enum keeps its table beside its Name/Parse functions:
//
//   constexpr EnumName<Accel> kAccels[] = {{Accel::kAuto, "auto"}, {Accel::kKvm, "kvm"}};
//   std::string_view AccelName(Accel a) { return NameIn(kAccels, a); }
//   std::optional<Accel> a = ValueIn(kAccels, "kvm");
//   NamesIn(kAccels)  // "auto or kvm"
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace dsec {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

// The value's name; the first entry's for a value the table lacks (an enum cast from a
// number the code never makes).
template <typename E, size_t N>
constexpr std::string_view NameIn(const EnumName<E> (&table)[N], E value) {
  for (const auto& e : table)
    if (e.value == value) return e.name;
  return table[0].name;
}

// The value a name stands for (exact, case-sensitive); nullopt for anything else.
template <typename E, size_t N>
constexpr std::optional<E> ValueIn(const EnumName<E> (&table)[N], std::string_view name) {
  for (const auto& e : table)
    if (e.name == name) return e.value;
  return std::nullopt;
}

// "a, b or c": every name, for an error message.
template <typename E, size_t N>
std::string NamesIn(const EnumName<E> (&table)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out += table[i].name;
  }
  return out;
}

}  // namespace dsec
