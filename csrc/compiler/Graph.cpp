#include "Graph.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_map>

namespace my_device::compiler {

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

size_t TensorMeta::storage_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = offset;
  for (size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * strides[d];
  return static_cast<size_t>(last + 1) * c10::elementSize(dtype);
}

bool TensorMeta::is_contiguous() const {
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

namespace {

constexpr int64_t kMaxValues = int64_t{1} << 24;

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

c10::ScalarType dtype_named(const std::string& name, int line) {
  static const std::unordered_map<std::string, c10::ScalarType> names = [] {
    std::unordered_map<std::string, c10::ScalarType> m;
#define MYDEV_NAME_DTYPE(_, n) m[#n] = c10::ScalarType::n;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(MYDEV_NAME_DTYPE)
#undef MYDEV_NAME_DTYPE
    return m;
  }();
  auto it = names.find(name);
  TORCH_CHECK(it != names.end(), "mydev program, line ", line, ": unknown dtype '", name, "'");
  return it->second;
}

// A recursive-descent reader over one line.
class LineReader {
 public:
  LineReader(const std::string& text, int line) : s_(text), line_(line) {}

  [[noreturn]] void fail(const std::string& what) const {
    TORCH_CHECK(false, "mydev program, line ", line_, ", column ", pos_ + 1, ": ", what, "\n  ", s_);
  }
  void skip_space() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ >= s_.size();
  }
  bool accept(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  std::string word() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != ' ' && s_[pos_] != '(' && s_[pos_] != ',' && s_[pos_] != ')' &&
           s_[pos_] != ']' && s_[pos_] != '[' && s_[pos_] != ':' && s_[pos_] != '{') {
      // "aten::op" keeps its "::"
      if (s_[pos_] == ':' ) break;
      ++pos_;
    }
    return s_.substr(start, pos_ - start);
  }
  std::string op_name() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != '(' && s_[pos_] != ' ') ++pos_;
    return s_.substr(start, pos_ - start);
  }
  int64_t integer() {
    skip_space();
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(s_.substr(pos_), &used);
    } catch (const std::exception&) {
      fail("expected an integer");
    }
    pos_ += used;
    return v;
  }
  double real() {
    skip_space();
    for (const auto& [text, v] : {std::pair<const char*, double>{"inf", std::numeric_limits<double>::infinity()},
                                  {"-inf", -std::numeric_limits<double>::infinity()},
                                  {"nan", std::numeric_limits<double>::quiet_NaN()}}) {
      const std::string t(text);
      if (s_.compare(pos_, t.size(), t) == 0) {
        pos_ += t.size();
        return v;
      }
    }
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s_.substr(pos_), &used);
    } catch (const std::exception&) {
      fail("expected a number");
    }
    pos_ += used;
    return v;
  }
  std::string quoted() {
    expect('"');
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out += s_[pos_++];
    }
    expect('"');
    return out;
  }
  int value_id() {
    expect('%');
    const int64_t v = integer();
    // Values are numbered from 0 (a vector holds them): a number beyond any program's is a damaged text.
    if (v < 0 || v >= kMaxValues) fail("value id out of range (0 to " + std::to_string(kMaxValues - 1) + ")");
    return static_cast<int>(v);
  }
  std::vector<int64_t> int_list(char open, char close) {
    std::vector<int64_t> out;
    expect(open);
    if (accept(close)) return out;
    do {
      out.push_back(integer());
    } while (accept(','));
    expect(close);
    return out;
  }
  TensorMeta meta() {
    TensorMeta m;
    m.dtype = dtype_named(word(), line_);
    m.sizes = int_list('[', ']');
    m.strides = int_list('{', '}');
    if (m.strides.size() != m.sizes.size()) fail("sizes and strides differ in rank");
    expect('+');
    m.offset = integer();
    return m;
  }
  Arg arg() {
    Arg a;
    skip_space();
    if (pos_ >= s_.size()) fail("expected an argument");
    const char c = s_[pos_];
    if (c == '%') {
      a.value = value_id();
      return a;
    }
    if (c == '[') {
      ++pos_;
      a.is_list = true;
      if (accept(']')) return a;
      do {
        a.items.push_back(arg());
      } while (accept(','));
      expect(']');
      return a;
    }
    ++pos_;
    switch (c) {
      case 'n':
        a.constant = c10::IValue();
        break;
      case 'i':
        a.constant = integer();
        break;
      case 'f':
        a.constant = real();
        break;
      case 'b':
        a.constant = integer() != 0;
        break;
      case 's':
        a.constant = quoted();
        break;
      case 'd':
        a.constant = c10::Device(quoted());
        break;
      case 't':  // a dtype by name: the dispatcher passes ScalarType as an int
        a.constant = static_cast<int64_t>(dtype_named(quoted(), line_));
        break;
      default:
        --pos_;
        fail(std::string("unknown argument kind '") + c + "'");
    }
    return a;
  }

 private:
  const std::string& s_;
  int line_;
  size_t pos_ = 0;
};

void define(Graph& g, int id, TensorMeta meta, int producer, const LineReader& r) {
  if (static_cast<size_t>(id) >= g.values.size()) g.values.resize(id + 1, Value{TensorMeta{}, -2});
  if (g.values[id].producer != -2) r.fail("value %" + std::to_string(id) + " is defined twice");
  g.values[id] = Value{std::move(meta), producer};
}

void check_defined(const Graph& g, const Arg& a, const LineReader& r) {
  if (a.value >= 0 && (static_cast<size_t>(a.value) >= g.values.size() || g.values[a.value].producer == -2)) {
    r.fail("value %" + std::to_string(a.value) + " is used before it is defined");
  }
  for (const Arg& item : a.items) check_defined(g, item, r);
}

} // namespace

Graph Graph::parse(const std::string& text) {
  Graph g;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  bool ended = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    LineReader r(line, lineno);
    if (ended) r.fail("statement after 'output'");
    if (line.rfind("program", 0) == 0) {
      g.name = line.size() > 8 ? line.substr(8) : "";
      continue;
    }
    if (line.rfind("input ", 0) == 0) {
      r.word();
      const int id = r.value_id();
      r.expect(':');
      define(g, id, r.meta(), -1, r);
      g.inputs.push_back(id);
      continue;
    }
    if (line.rfind("output", 0) == 0) {
      r.word();
      while (!r.at_end()) {
        Arg a;
        a.value = r.value_id();
        check_defined(g, a, r);
        g.outputs.push_back(a.value);
      }
      ended = true;
      continue;
    }
    Node node;
    node.line = lineno;
    std::vector<int> outs;
    do {
      outs.push_back(r.accept('_') ? -1 : r.value_id());  // `_`: a return the program does not use (None)
    } while (r.accept(','));
    r.expect('=');
    node.op = r.op_name();
    r.expect('(');
    if (!r.accept(')')) {
      do {
        node.args.push_back(r.arg());
        check_defined(g, node.args.back(), r);
      } while (r.accept(','));
      r.expect(')');
    }
    r.expect(':');
    const int index = static_cast<int>(g.nodes.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      if (i) r.expect(',');
      if (outs[i] < 0) {
        r.expect('_');
      } else {
        define(g, outs[i], r.meta(), index, r);
      }
    }
    if (r.accept('@')) node.source = r.quoted();
    if (!r.at_end()) r.fail("unexpected text after the statement");
    node.outputs = std::move(outs);
    g.nodes.push_back(std::move(node));
  }
  TORCH_CHECK(ended, "mydev program '", g.name, "': no 'output' statement");
  // Ids need not be dense (a frontend may drop dead values): an id never
  // defined is simply never used, which check_defined made sure of.
  return g;
}

std::string TensorMeta::str() const {
  return std::string(c10::toString(dtype)) + "[" + join(sizes) + "]{" + join(strides) + "}+" +
         std::to_string(offset);
}

std::string str(const Arg& a) {
  if (a.value >= 0) return "%" + std::to_string(a.value);
  if (a.is_list) {
    std::string s = "[";
    for (size_t i = 0; i < a.items.size(); ++i) s += (i ? ", " : "") + str(a.items[i]);
    return s + "]";
  }
  const c10::IValue& c = a.constant;
  if (c.isNone()) return "n";
  if (c.isBool()) return c.toBool() ? "b1" : "b0";
  if (c.isInt()) return "i" + std::to_string(c.toInt());
  if (c.isDouble()) {
    const double v = c.toDouble();
    if (std::isnan(v)) return "fnan";
    if (std::isinf(v)) return v > 0 ? "finf" : "f-inf";
    std::ostringstream s;
    s.precision(17);
    s << "f" << v;
    return s.str();
  }
  if (c.isDevice()) return "d\"" + c.toDevice().str() + "\"";
  if (c.isString()) {
    std::string s = "s\"";
    for (char ch : c.toStringRef()) {
      if (ch == '"' || ch == '\\') s += '\\';
      s += ch;
    }
    return s + "\"";
  }
  return "?";
}

std::string Graph::str() const {
  std::ostringstream s;
  s << "program " << name << "\n";
  for (int id : inputs) s << "input %" << id << " : " << values[id].meta.str() << "\n";
  for (const Node& n : nodes) {
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      s << (i ? ", " : "");
      if (n.outputs[i] < 0) {
        s << "_";
      } else {
        s << "%" << n.outputs[i];
      }
    }
    s << " = " << n.op << "(";
    for (size_t i = 0; i < n.args.size(); ++i) s << (i ? ", " : "") << compiler::str(n.args[i]);
    s << ") : ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      s << (i ? ", " : "") << (n.outputs[i] < 0 ? "_" : values[n.outputs[i]].meta.str());
    }
    if (!n.source.empty()) s << " @ \"" << n.source << "\"";
    s << "\n";
  }
  s << "output";
  for (int id : outputs) s << " %" << id;
  s << "\n";
  return s.str();
}

} // namespace my_device::compiler
