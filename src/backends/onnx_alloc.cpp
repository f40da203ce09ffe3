// The entry point ONNX Runtime calls to allocate through the module's counting allocator (onnx_alloc.rs).
// ONNX Runtime does not check for a null allocation (a refused one crashed Redis), but it catches C++
// exceptions around kernels and session creation and turns them into a failed call: so a refusal is thrown
// here, in C++, where throwing is defined (Rust cannot throw, and no Rust frame is unwound: the Rust side
// returns first).
#include <cstddef>
#include <new>

extern "C" void* rai_onnx_counted_alloc(std::size_t size);

// OrtAllocator::Alloc and OrtAllocator::Reserve (the allocator argument is unused).
extern "C" void* rai_onnx_alloc_or_throw(void* /* this */, std::size_t size) {
  void* p = rai_onnx_counted_alloc(size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

extern "C" void* rai_onnx_reserve_or_throw(const void* /* this */, std::size_t size) {
  return rai_onnx_alloc_or_throw(nullptr, size);
}
