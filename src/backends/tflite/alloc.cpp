// LiteRT's C++ allocations, counted against the TFLITE memory bound (alloc.rs): libLiteRt.so's calls to
// `operator new` / `operator delete` are pointed here. In C++ because `operator new` reports failure by
// throwing std::bad_alloc, which must not cross a Rust frame. The throwing forms are never refused (LiteRT's
// C API does not catch the exception: Redis would abort); the Rust side counts them and marks a run that
// passes the bound, which its cancellation check then stops. The nothrow forms may be refused (null).
#include <cstddef>
#include <new>

extern "C" bool rai_tflite_admit(std::size_t size, bool refusable);
extern "C" void rai_tflite_settle(void* p, std::size_t reserved);
extern "C" void rai_tflite_release(void* p);

namespace {

template <typename New>
void* counted(std::size_t size, New make) {
  rai_tflite_admit(size, false);
  void* p;
  try {
    p = make();
  } catch (...) {
    rai_tflite_settle(nullptr, size);
    throw;
  }
  rai_tflite_settle(p, size);
  return p;
}

template <typename New>
void* counted_nothrow(std::size_t size, New make) noexcept {
  if (!rai_tflite_admit(size, true)) return nullptr;
  void* p = make();
  rai_tflite_settle(p, size);
  return p;
}

}  // namespace

extern "C" {

void* rai_tflite_new(std::size_t size) {
  return counted(size, [&] { return ::operator new(size); });
}

void* rai_tflite_new_array(std::size_t size) {
  return counted(size, [&] { return ::operator new[](size); });
}

void* rai_tflite_new_nothrow(std::size_t size, const std::nothrow_t& tag) noexcept {
  return counted_nothrow(size, [&] { return ::operator new(size, tag); });
}

void* rai_tflite_new_array_nothrow(std::size_t size, const std::nothrow_t& tag) noexcept {
  return counted_nothrow(size, [&] { return ::operator new[](size, tag); });
}

// Uncounted before the block is freed: once freed, its address may be another thread's new block.
void rai_tflite_delete(void* p) noexcept {
  rai_tflite_release(p);
  ::operator delete(p);
}

void rai_tflite_delete_array(void* p) noexcept {
  rai_tflite_release(p);
  ::operator delete[](p);
}

void rai_tflite_delete_sized(void* p, std::size_t size) noexcept {
  rai_tflite_release(p);
  ::operator delete(p, size);
}

void rai_tflite_delete_array_sized(void* p, std::size_t size) noexcept {
  rai_tflite_release(p);
  ::operator delete[](p, size);
}

void rai_tflite_delete_nothrow(void* p, const std::nothrow_t& tag) noexcept {
  rai_tflite_release(p);
  ::operator delete(p, tag);
}

void rai_tflite_delete_array_nothrow(void* p, const std::nothrow_t& tag) noexcept {
  rai_tflite_release(p);
  ::operator delete[](p, tag);
}

}  // extern "C"
