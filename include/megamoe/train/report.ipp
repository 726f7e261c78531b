// SPDX-License-Identifier: Apache-2.0
// megamoe/train/report.ipp — the definitions behind report.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/train/report.hpp>

namespace megamoe::train {

MEGAMOE_DECL void write_svg(std::filesystem::path const& path, training_history const& h) {
  int const width = 900, plot_h = 320, heat_h = 140, margin = 50;
  int const layers = static_cast<int>(h.load.size());
  int const height = margin + plot_h + layers * (heat_h + margin) + margin;
  std::ofstream out(path);
  if (!out) throw input_error("plot: cannot write " + path.string());
  char buf[256];
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
         "fill='white'/>\n";
  int const steps = static_cast<int>(h.train_bpb.size());
  double top = h.unigram_bpb;
  for (double v : h.train_bpb)
    if (std::isfinite(v)) top = std::max(top, v);
  top = std::ceil(top + 0.5);
  double const x0 = margin, x1 = width - margin, y0 = margin, y1 = margin + plot_h;
  auto x_of = [&](double step) { return x0 + (x1 - x0) * (step - 1) / std::max(1, steps - 1); };
  auto y_of = [&](double bpb) { return y1 - (y1 - y0) * std::clamp(bpb, 0.0, top) / top; };
  out << "<text x='" << x0 << "' y='" << y0 - 15
      << "'>loss in bits per byte: training (blue), held-out (red), unigram baseline "
         "(dashed)</text>\n";
  out << "<rect x='" << x0 << "' y='" << y0 << "' width='" << x1 - x0 << "' height='" << y1 - y0
      << "' fill='none' stroke='black'/>\n";
  for (int tick = 0; tick <= static_cast<int>(top); ++tick) {
    std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' text-anchor='end'>%d</text>\n", x0 - 5,
                  y_of(tick) + 4, tick);
    out << buf;
  }
  auto polyline = [&](std::vector<std::pair<double, double>> const& points, char const* style) {
    out << "<polyline fill='none' " << style << " points='";
    for (auto const& [s, v] : points)
      if (std::isfinite(v)) out << x_of(s) << ',' << y_of(v) << ' ';
    out << "'/>\n";
  };
  std::vector<std::pair<double, double>> train, heldout;
  for (int s = 0; s < steps; ++s)
    train.emplace_back(s + 1, h.train_bpb[static_cast<std::size_t>(s)]);
  for (auto const& [s, v] : h.heldout_bpb) heldout.emplace_back(s, v);
  polyline(train, "stroke='steelblue' stroke-width='1'");
  polyline(heldout, "stroke='firebrick' stroke-width='2'");
  polyline({{1, h.unigram_bpb}, {std::max(1, steps), h.unigram_bpb}},
           "stroke='gray' stroke-dasharray='6,4'");
  std::snprintf(buf, sizeof buf, "<text x='%g' y='%g' text-anchor='end'>step %d</text>\n", x1,
                y1 + 16, steps);
  out << buf;
  // Heat maps: experts down, steps across, darker = larger share.
  for (int l = 0; l < layers; ++l) {
    auto const& rows = h.load[static_cast<std::size_t>(l)];
    if (rows.empty()) continue;
    int const experts = static_cast<int>(rows.front().size());
    double const top_y = y1 + margin + l * (heat_h + margin);
    out << "<text x='" << x0 << "' y='" << top_y - 6 << "'>MoE layer " << l
        << ": share of routed tokens per expert (rows) over steps (columns); white 0, black "
        << "2/E</text>\n";
    int const columns = std::min(static_cast<int>(rows.size()), 300);
    double const cw = (x1 - x0) / columns, ch = static_cast<double>(heat_h) / experts;
    for (int c = 0; c < columns; ++c) {
      auto const& step =
          rows[static_cast<std::size_t>(c * static_cast<int>(rows.size()) / columns)];
      for (int e = 0; e < experts; ++e) {
        double const share = step[static_cast<std::size_t>(e)] * experts / 2.0;
        int const grey = 255 - static_cast<int>(255 * std::clamp(share, 0.0, 1.0));
        std::snprintf(buf, sizeof buf,
                      "<rect x='%.2f' y='%.2f' width='%.2f' height='%.2f' fill='rgb(%d,%d,%d)'/>\n",
                      x0 + c * cw, top_y + e * ch, cw + 0.3, ch + 0.3, grey, grey, grey);
        out << buf;
      }
    }
  }
  out << "</svg>\n";
  if (!out) throw input_error("plot: writing " + path.string() + " failed");
}

}  // namespace megamoe::train
