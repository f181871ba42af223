// Lets torch._inductor.aoti_load_package (torch::inductor::AOTIModelPackageLoader)
// run a model that AOTInductor compiled for mydev. The loader picks a runner by
// the package's device key from a registry that only C++ can extend, and
// without one it fails with "Unsupported device key found: mydev".
//
// The runner is CPU's: the compiled model is created for the host ("cpu").
// AOTInductor's model runtime (aoti_runtime/model_base.h, compiled into every
// package) accepts only cpu, cuda, xpu and mps as device strings, and creates a
// model's weights in one buffer on the model's device. mydev's generated wrapper
// runs on the host anyway, queues its kernels on mydev streams itself, allocates
// on mydev explicitly, and its model constructor loads the packaged weights
// itself, each mydev weight onto mydev once, at load time
// (my_device/inductor/cpp_wrapper.py).
#include <torch/csrc/inductor/aoti_runner/model_container_runner_cpu.h>

#include <memory>
#include <string>

namespace my_device::inductor {
namespace {

std::unique_ptr<torch::inductor::AOTIModelContainerRunner> create_runner(const std::string& model_so_path,
                                                                         size_t num_models,
                                                                         const std::string& /*device_str*/,
                                                                         const std::string& /*bin_dir*/,
                                                                         const bool run_single_threaded) {
  return std::make_unique<torch::inductor::AOTIModelContainerRunnerCpu>(model_so_path, num_models,
                                                                          run_single_threaded);
}

const torch::inductor::RegisterAOTIModelRunner register_runner("mydev", &create_runner);

} // namespace
} // namespace my_device::inductor
