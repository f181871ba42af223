// torch.mydev's graph and memory-pool functions (my_device/mydev/graphs.py,
// memory.py). The graph class itself is torch.accelerator.Graph's, which
// reaches core/Graph.cpp through PyTorch's registry.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/core/StorageImpl.h>

#include <unordered_set>

#include "../core/Allocator.h"
#include "../core/Device.h"
#include "../core/Graph.h"
#include "../core/TensorImpl.h"

namespace my_device {

namespace {

// Inductor's cudagraph trees name storages by their StorageImpl address (`storage._cdata`).
c10::StorageImpl* storage_at(size_t cdata) {
  return reinterpret_cast<c10::StorageImpl*>(cdata);  // NOLINT(performance-no-int-to-ptr)
}

// What cudagraph trees need from the allocator and from tensors: the functions
// torch.cuda binds for them (as torch._C._cuda_getCheckpointState and the
// like), for mydev. my_device/inductor/graph_trees.py maps the names.
void init_graph_tree_bindings(pybind11::module& m) {
  pybind11::class_<PoolCheckpoint, std::shared_ptr<PoolCheckpoint>>(m, "_PoolCheckpoint");
  m.def("_pool_checkpoint", [](int device, c10::MempoolId_t id) {
    return std::make_shared<PoolCheckpoint>(checkpoint_pool(static_cast<c10::DeviceIndex>(device), id));
  });
  // Restores `checkpoint`; storages in `stale` whose blocks it freed stop owning
  // them, and those in `alive` (replay outputs, owning nothing) take ownership of
  // their blocks, allocated again (others are left as they are). Blocks allocated again that no storage takes
  // stay allocated: the trees free them (raw delete) when their tensors are dead.
  m.def("_pool_restore", [](const std::shared_ptr<PoolCheckpoint>& checkpoint, const std::vector<size_t>& stale,
                            const std::vector<size_t>& alive) {
    const PoolRestore restored = restore_pool(*checkpoint);
    const std::unordered_set<void*> freed(restored.freed.begin(), restored.freed.end());
    for (size_t cdata : stale) {
      c10::DataPtr& data = storage_at(cdata)->mutable_data_ptr();
      if (freed.count(data.get()) != 0 && is_device_data_ptr(data)) {
        data.compare_exchange_deleter(data.get_deleter(), &c10::detail::deleteNothing);
      }
    }
    const std::unordered_set<void*> allocated(restored.allocated.begin(), restored.allocated.end());
    for (size_t cdata : alive) {
      c10::StorageImpl* storage = storage_at(cdata);
      void* ptr = storage->data_ptr().get();
      if (allocated.count(ptr) == 0) continue;  // no memory (0 bytes), or none of the pool's blocks
      TORCH_CHECK(storage->data_ptr().get_context() == nullptr,
                  "mydev memory pool checkpoint: a live storage at ", ptr, " already owns its memory");
      storage->set_data_ptr_noswap(owning_data_ptr(checkpoint->device, ptr));
    }
  });
  m.def("_pool_allocations_are", [](int device, c10::MempoolId_t id, const std::vector<size_t>& ptrs) {
    std::vector<void*> pointers;
    for (size_t p : ptrs) pointers.push_back(reinterpret_cast<void*>(p));  // NOLINT(performance-no-int-to-ptr)
    return pool_allocations_are(static_cast<c10::DeviceIndex>(device), id, pointers);
  });
  m.def("_owns_device_memory", [](size_t cdata) { return is_device_data_ptr(storage_at(cdata)->data_ptr()); });
  // Frees the storage's block now; the storage stays, owning nothing.
  m.def("_free_and_disown", [](size_t cdata) {
    c10::DataPtr& data = storage_at(cdata)->mutable_data_ptr();
    TORCH_CHECK(is_device_data_ptr(data), "expected a storage that owns mydev memory");
    void* ptr = data.get();
    data.compare_exchange_deleter(data.get_deleter(), &c10::detail::deleteNothing);
    free_device_pointer(ptr);
  });
  // A tensor whose memory a later replay overwrites: CUDA's binding takes its
  // storage away, which CUDA's kernels notice when they ask for the data
  // pointer; mydev's read the storage they are given, so the tensor gets a
  // storage of no memory whose data pointer raises `message` instead.
  m.def("_set_storage_access_error_msg", [](const at::Tensor& t, const std::string& message) {
    c10::Storage gone(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), t.storage().nbytes(), c10::DataPtr(nullptr, t.device()),
        /*allocator=*/nullptr, /*resizable=*/false));
    gone.unsafeGetStorageImpl()->release_data_and_set_meta_custom_data_ptr_error_msg_(message);
    t.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(gone));
  });
  m.def("_set_storage_data_ptr_access_error_msg", [](size_t cdata, const std::string& message) {
    storage_at(cdata)->release_data_and_set_meta_custom_data_ptr_error_msg_(message);
  });
  m.def("_tensor_from_storage", [](const c10::Storage& storage, at::ScalarType dtype, std::vector<int64_t> sizes,
                                   std::vector<int64_t> strides, int64_t storage_offset) {
    return make_tensor(storage, c10::scalarTypeToTypeMeta(dtype), sizes, strides, storage_offset);
  });
}

} // namespace

void init_graph_bindings(pybind11::module& m) {
  m.def("_register_graph_impl", &register_graph_impl);
  m.def("_is_current_stream_capturing",
        [](int device) { return current_stream_capturing(static_cast<c10::DeviceIndex>(device)); });
  m.def("_graph_pool_handle", [] { return new_pool_id(/*user_created=*/true); });
  m.def("_mempool_create", [](int device) {
    const c10::MempoolId_t id = new_pool_id(/*user_created=*/true);
    retain_pool(static_cast<c10::DeviceIndex>(device), id);
    return id;
  });
  m.def("_mempool_release", [](int device, c10::MempoolId_t id) {
    release_pool(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("_mempool_use_count", [](int device, c10::MempoolId_t id) {
    return pool_use_count(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("_begin_allocate_current_thread_to_pool", [](int device, c10::MempoolId_t id) {
    begin_allocate_to_pool(static_cast<c10::DeviceIndex>(device), id, /*capture_id=*/0);
  });
  m.def("_end_allocate_current_thread_to_pool", [](int device, c10::MempoolId_t id) {
    end_allocate_to_pool(static_cast<c10::DeviceIndex>(device), id);
  });
  init_graph_tree_bindings(m);
}

} // namespace my_device
