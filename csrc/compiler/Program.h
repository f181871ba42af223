#pragma once
// A compiled mydev program: a Graph (Graph.h) turned into steps that run as ONE
// task on the current stream, as a CUDA graph replay does.
//
// Compilation:
//  - view ops become geometry over their base (no step at all);
//  - chains of elementwise ops become one ElementwiseKernel each (Fusion.h),
//    a sum/mean/amax/amin of a chain's result joining the chain;
//  - small Float matrix products (addmm, mm) become a GemmKernel (Gemm.h);
//  - every other op is a call of its CPU kernel on device memory, the kernel
//    eager mode runs (csrc/native/HostKernel.h), through its out= overload when
//    it has one, so that its output lands in a planned buffer;
//  - intermediates are laid out in one arena by liveness (MemoryPlan.h).
// Running (run()): checks the inputs, allocates the outputs on the device
// (the arena is the program's own, per stream), and queues one task; the host
// returns at once. A failing op is
// reported at the next synchronisation as "<program>: <op> (line N): <error>".
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "Elementwise.h"
#include "Gemm.h"
#include "Graph.h"
#include "MemoryPlan.h"
#include "StepSchedule.h"

namespace my_device::compiler {

// Where a value lives while the program runs.
struct Location {
  enum Kind : uint8_t { Input, Arena, Output, Held } kind = Held;
  int root = -1;      // the value whose storage it is in (itself unless a view)
  int slot = -1;      // input index, arena buffer index, or output buffer index
};

struct Step {
  // Copy: a clone, its one tensor slot's bytes copied into its planned output.
  enum Kind : uint8_t { Call, Fused, Gemm, Copy } kind = Call;
  int node = -1;                   // the (last) node it runs, for messages
  std::string label;               // "aten::addmm (line 5)"
  // Call
  std::optional<c10::OperatorHandle> op;
  bool use_out = false;            // op is the out= overload; outputs are pushed as its out arguments
  std::optional<c10::OperatorHandle> functional;  // use_out: the op it stands for
  std::vector<c10::IValue> stack;  // constants, with placeholders for values
  struct Slot {
    size_t index;                  // in stack
    std::vector<int> values;       // one value, or a list's (-1: None)
    enum Kind : uint8_t { Tensor, TensorList, OptionalTensorList } kind;
  };
  std::vector<Slot> slots;
  std::vector<size_t> generators;  // stack indices of Generator? arguments
  size_t first_generator = 0;      // where its generators start in the launch's list
  // Both
  std::vector<int> inputs;         // Fused: values loaded
  std::vector<int> outputs;        // values written
  ElementwiseKernel kernel;        // Fused
  GemmKernel gemm;                 // Gemm: its operands are the Call's tensor slots and first output
  std::vector<int> release;        // values whose last reader this step is
  std::vector<int> held;           // the released values' roots it touches (for a run side by side)
  // A step may run in parts (Program::choose_parts), side by side or, in order, as blocks for whichever unit is
  // free (run_blocks, as eager kernels): a product by rows of its output, a
  // pooling by samples (Batch: into its planned outputs; Samples: an attention's call per part, its
  // results copied into the program's values; InputSamples: the same with only the first argument cut, a
  // convolution's input), a convolution's backward as its input's gradient and its weight's; Elements: an
  // elementwise op's call (out=, or its result copied) by ranges of its elements, each starting where a vector
  // loop's step does.
  enum Split : uint8_t { Whole, Rows, Batch, Samples, InputSamples, Grads, Elements } split = Whole;
  int parts = 1;
};
// convolution_backward's output_mask argument, convolution's transposed.
constexpr size_t kConvolutionBackwardMask = 10;
constexpr size_t kConvolutionTransposed = 6;
// The most parts a step is cut into: the device's units beyond two are rare, and each part pays a hand-over.
constexpr int kMaxStepParts = 2;

struct ProgramStats {
  int64_t nodes = 0;
  int64_t steps = 0;
  int64_t fused_groups = 0;
  int64_t fused_nodes = 0;
  int64_t views = 0;
  int64_t calls = 0;
  int64_t out_calls = 0;
  int64_t gemms = 0;
  size_t arena_bytes = 0;
  size_t naive_bytes = 0;
};

// What the queued task keeps of a tensor the program reads or writes: its
// bytes, and its storage unless the block is leased (core/KernelArgs.h). Its
// geometry is the program's own (run() checked it), so no TensorImpl is kept:
// a launch makes none on the host, and its task frees none.
struct Operand {
  c10::Storage hold;
  void* base = nullptr;  // the storage's first byte (a device address)
  size_t nbytes = 0;
  int64_t offset = 0;    // the tensor's storage offset, in elements
  at::Tensor host;       // a 0-dim CPU input: its value at the launch

  // The bytes when the task runs: a held storage's as they are then (the
  // caller may have resized it since the launch); a leased block's where it was
  // (core/KernelArgs.h).
  void* data() const {
    return hold ? hold.mutable_data() : base;
  }
  size_t size() const {
    return hold ? hold.nbytes() : nbytes;
  }
};

// What a node's operator gives on meta tensors of the program's geometry
// (run_on_meta, which first checks each argument's kind against the schema):
// how a program's text is checked against its ops, and which results really
// alias an argument (aten::reshape and aten::to alias it only when they copy
// nothing).
struct MetaRun {
  bool ran = false;                  // false: no meta kernel, or it refused (refusal)
  std::vector<c10::IValue> args;
  std::vector<at::Tensor> results;
  std::string refusal;
  // Argument `index` (its list's `item`-th tensor; item -1: the argument itself), if it is a tensor.
  std::optional<at::Tensor> argument(size_t index, int item) const;
  // Whether result `result` aliases that argument and reads it as it is (not a _conj or _neg_view of
  // it); true when the meta kernel did not run (the schema's word).
  bool plain_alias(size_t result, size_t index, int item) const;
};
MetaRun run_on_meta(const Graph& g, const Node& n, const c10::OperatorHandle& op);

class Program : public std::enable_shared_from_this<Program> {
 public:
  static std::shared_ptr<Program> compile(Graph graph);

  // Queues the program on the current stream of its inputs' device (or of
  // `device` when it has no input) and returns its outputs.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, c10::DeviceIndex device = -1);

  const std::string& name() const {
    return graph_.name;
  }
  const ProgramStats& stats() const {
    return stats_;
  }
  // The graph, then the steps with their kernels and the memory plan (and,
  // once profiled runs finished, each step's time).
  std::string dump() const;
  // Time each step of later runs (on the worker), for dump(): where a
  // program spends its time.
  void set_profiling(bool on) {
    profiling_ = on;
  }
  // Whether runs share the steps among the device's compute units (StepSchedule.h): nullopt until the
  // runs that decide it (each way, in order and side by side, timed kDecidingRuns times, taking turns) have run.
  std::optional<bool> runs_side_by_side() const;

  // Runs on the stream's worker: what the queued task does.
  // `operands`: the inputs, then the output buffers, then the arena if any.
  void execute(c10::DeviceIndex device, const std::vector<Operand>& operands,
               std::vector<c10::IValue> generators) const;

 private:
  explicit Program(Graph graph) : graph_(std::move(graph)) {}
  // build() runs its phases in order: check_geometry, resolve_nodes (which
  // checks each node's results, check_results), order_steps (StepOrder: fusion
  // groups and calls), place_values.
  struct NodeFacts;
  class StepOrder;
  friend class StepOrder;
  void build();
  void check_geometry();
  NodeFacts resolve_nodes();
  void check_results(const Node& n, const MetaRun& meta, const std::vector<int>& aliased) const;
  void check_reach(const Node& n, int out, int base);
  void order_steps(const NodeFacts& facts);
  void place_values();
  void plan_schedule();
  std::vector<Touch> touches(const Step& st) const;
  void choose_parts(Step& st) const;
  int root(int v) const {
    return where_[v].root;
  }

  Graph graph_;
  std::vector<Step> steps_;
  std::vector<Location> where_;          // per value
  std::vector<bool> read_;               // per storage root: a node or the caller reads it
  std::vector<bool> used_;               // per value: a node or the caller reads it (itself, not its views)
  // Per input: the bytes its views reach past the input's first element, and
  // where the earliest starts (<= 0); run() checks the storage of the tensor
  // given holds them, counted from its storage offset.
  std::vector<int64_t> input_reach_;
  std::vector<int64_t> input_low_;
  std::vector<TensorMeta> output_buffers_;  // geometry of buffers the program returns
  std::vector<int> arena_buffers_;       // value id of each arena buffer
  MemoryPlan plan_;
  // The arena of each stream the program ran on, kept for its later runs (as a
  // CUDA graph keeps its private pool): runs on one stream execute one after
  // another, so they can share it, and a launch allocates only its outputs.
  at::Tensor arena_for(c10::DeviceIndex device);
  std::mutex arenas_mutex_;
  std::vector<std::pair<c10::Stream, at::Tensor>> arenas_;
  ProgramStats stats_;
  std::atomic<bool> profiling_{false};
  mutable std::vector<std::atomic<int64_t>> step_ns_;  // per step, summed over profiled runs
  // Per step with an out= call: whether that call has run (Confirmed) or
  // needed to resize its planned output (Refused: the step runs the
  // functional op and copies its results into the plan).
  enum class OutCall : uint8_t { Untried, Confirmed, Refused };
  mutable std::vector<std::atomic<OutCall>> out_calls_;
  mutable std::atomic<int64_t> profiled_runs_{0};
  // Running steps side by side (StepSchedule), decided by timing the runs after the first (which runs each
  // out= call's first try): the second's steps one after another say whether the schedule could gain
  // (StepSchedule::worth_it); if so, runs side by side and in order take turns (Trial) until each way has
  // kDecidingRuns runs timed whole (the second counting as one in order), and the faster way stays. A model of the gain alone chose wrongly: a product in two parts
  // on one thread each took longer than the whole product on both (each part packs the whole second
  // operand), and each hand-over between units costs a wake-up.
  StepSchedule schedule_;
  std::vector<int> held_users_;                  // per value: the steps touching it, if a step releases it
  std::vector<std::vector<int>> released_with_;  // per root: the held values dropped after its last user
  enum class Parallel : uint8_t { No, Unknown, Trial, Yes };
  static constexpr size_t kDecidingRuns = 5;
  mutable std::atomic<Parallel> parallel_{Parallel::No};
  mutable std::atomic<int64_t> runs_{0};
  mutable std::mutex deciding_mutex_;
  mutable std::vector<int64_t> in_order_ns_, side_by_side_ns_;  // whole runs' times while deciding
  void decide(Parallel ran, bool side_by_side, int64_t ns, const std::vector<int64_t>& took) const;
  // The run that times each step whole, in order, for the decision: the second while it is unknown.
  static bool timed_run(Parallel parallel, int64_t run_index) {
    return parallel == Parallel::Unknown && run_index >= 1;
  }
};

// Process-wide counters of my_device.compiler.counters().
struct CompilerCounters {
  int64_t graphs_compiled = 0;
  int64_t fused_groups = 0;
  int64_t fused_nodes = 0;
  int64_t launches = 0;
  int64_t ops_launched = 0;  // graph nodes run by those launches
};
CompilerCounters& counters();

} // namespace my_device::compiler
