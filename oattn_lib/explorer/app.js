(function () {
"use strict";
const D = JSON.parse(document.getElementById("oattn-data").textContent);
const M = D.meta, NL = M.n_layer, NH = M.n_head, NU = NL * NH;
const metricNames = Object.keys(D.metrics);
const state = {sample: 0, unit: M.units_2d.length ? M.units_2d[0] : 0, metric: metricNames[0],
               colorBy: "layer", level: 2};
const $ = (id) => document.getElementById(id);
const PCONF = {displaylogo: false, responsive: true};
const VIEWS = ["raw", "org3d", "org2d", "resid"];
const cache = new Map();

// the model's own indices of the stored layers and heads (positions 0.. index them)
const LID = M.layers || range(NL), HID = M.heads || range(NH);
const layerOf = (u) => LID[Math.floor(u / NH)], headOf = (u) => HID[u % NH];
function unitName(u) { return "L" + layerOf(u) + " H" + headOf(u); }
// the unit of the model's (layer, head), -1 where the page does not hold it
function unitOf(layer, head) {
  const l = LID.indexOf(+layer), h = HID.indexOf(+head);
  return l < 0 || h < 0 ? -1 : l * NH + h;
}
// masked entries show the plot's background: a grey that neither colour scale has (plotly's own
// RdBu is grey at 0, so the residual uses ColorBrewer's, white at 0: negative red, positive blue)
const MASKED_BG = "#9e9e9e";
const RESID_SCALE = [[0, "#b2182b"], [0.25, "#ef8a62"], [0.45, "#fddbc7"], [0.5, "#f7f7f7"], [0.55, "#d1e5f0"],
                     [0.75, "#67a9cf"], [1, "#2166ac"]];

// -- data: base64 -> gzip -> 8-bit codes -> values ---------------------------------------
async function inflate(b64) {
  if (!b64) return new Uint8Array(0);
  const bin = atob(b64), bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}
async function decode(block, sizes) {
  const codes = await inflate(block.data), out = [];
  let off = 0;
  sizes.forEach((n, i) => {
    const lo = block.lo[i], span = block.hi[i] - block.lo[i], z = new Float64Array(n);
    for (let j = 0; j < n; j++) z[j] = lo + (codes[off + j] / 255) * span;
    out.push(z); off += n;
  });
  return out;
}
// a layer's mask in token order (1 = the model may attend), from its rule: a band of key - query
// offsets (causal: [-(n - 1), 0]) or numpy's packbits of the mask (most significant bit first)
async function maskOf(rule, nq, nk) {
  const A = new Uint8Array(nq * nk);
  if (rule.band) {
    const [lo, hi] = rule.band;
    for (let i = 0; i < nq; i++) for (let j = 0; j < nk; j++) A[i * nk + j] = (j - i >= lo && j - i <= hi) ? 1 : 0;
  } else {
    const bits = await inflate(rule.bits);
    for (let k = 0; k < A.length; k++) A[k] = (bits[k >> 3] >> (7 - (k & 7))) & 1;
  }
  return A;
}
async function sampleData(pos) {
  if (cache.has(pos)) return cache.get(pos);
  const S = D.samples[pos], nq = S.n_query || M.n_query, nk = S.n_key || M.n_key,
    d = {full: new Map(), resid: new Map(), lod: null, masks: [], layerMask: null};
  if (S.mask) {
    d.masks = await Promise.all(S.mask.rules.map((r) => maskOf(r, nq, nk)));
    d.layerMask = S.mask.layers;
  }
  if (S.full) {
    const raw = await decode(S.full.raw, S.full.units.map(() => nq * nk));
    S.full.units.forEach((u, i) => d.full.set(u, raw[i]));
    const res = await decode(S.full.resid, S.full.resid_units.map(() => nq * nk));
    S.full.resid_units.forEach((u, i) => d.resid.set(u, res[i]));
  }
  if (S.lod) {
    const L = S.lod, cells = (e) => (e.rows.length - 1) * (e.cols.length - 1);
    const raw = await decode(L.raw, Array(NU).fill(cells(L.raw)));
    const org3 = await decode(L.org3d, Array(NU).fill(cells(L.org3d)));
    const sz2 = L.units2d.map((u) => cells(L.edges2d[u]));
    const org2 = await decode(L.org2d, sz2), res2 = await decode(L.resid, sz2);
    d.lod = {raw, org3, two: new Map(L.units2d.map((u, i) => [u, {org: org2[i], res: res2[i]}]))};
  }
  cache.set(pos, d);
  return d;
}

// -- the four views of a head -------------------------------------------------------------
// A view: its base z (rows x cols, at full resolution or the level of detail), row and column
// edges in token positions of the view's order, the row and column trees (order, boundary
// depths: the view's rows are tokens rt.order, its columns ct.order) and, where the head is
// shipped at full resolution, `src`: the flat head and the row and column orders that lay it
// out in this view (what a zoom shows at full resolution), with the head's mask (token order)
// and the orders that lay the mask out the same way. Masked entries are null.
const ZOOM_CELLS = 65536;
function range(n) { return Array.from({length: n}, (_, i) => i); }
function sub(src, r0, r1, c0, c1) {
  const out = [], A = src.A, nk = src.nk;
  for (let i = r0; i < r1; i++) {
    const row = new Array(c1 - c0), base = src.ro[i] * nk, mbase = A ? src.mro[i] * nk : 0;
    for (let j = c0; j < c1; j++) row[j - c0] = A && !A[mbase + src.mco[j]] ? null : src.X[base + src.co[j]];
    out.push(row);
  }
  return out;
}
// a level of detail's blocks (edges r, c in the view's order; view rows are tokens ro, columns
// co) with no allowed entry of mask A become null: their means are over the allowed entries only
function maskBlocks(z, A, ro, co, r, c, nk) {
  if (!A) return z;
  const nc = c.length - 1, any = new Uint8Array((r.length - 1) * nc);
  const blockOf = (e) => {
    const out = new Int32Array(e[e.length - 1]);
    for (let b = 0; b + 1 < e.length; b++) out.fill(b, e[b], e[b + 1]);
    return out;
  };
  const rb = blockOf(r), cb = blockOf(c);
  for (let i = 0; i < ro.length; i++) {
    const base = ro[i] * nk, bi = rb[i] * nc;
    for (let j = 0; j < co.length; j++) if (A[base + co[j]]) any[bi + cb[j]] = 1;
  }
  return z.map((row, i) => row.map((v, j) => any[i * nc + j] ? v : null));
}
function allowedOf(d, u) {
  const i = d.layerMask ? d.layerMask[Math.floor(u / NH)] : -1;
  return i >= 0 ? d.masks[i] : null;
}
function reshape(z, nr, nc) {
  return range(nr).map((i) => Array.from(z.subarray(i * nc, (i + 1) * nc)));
}
async function views(pos, u) {
  const S = D.samples[pos], d = await sampleData(pos), nq = S.n_query || M.n_query, nk = S.n_key || M.n_key;
  const o2 = S.o2d[u], X = d.full.get(u), R = d.resid.get(u), A = allowedOf(d, u);
  const id = {order: range(nq)}, idk = {order: range(nk)};
  // the head X is in token order, the residual R in its own 2-D order; the mask A in token order
  const src = (Y, ro, co, mro, mco) => Y ? {X: Y, ro: ro, co: co, nk: nk, A: A, mro: mro, mco: mco} : null;
  const specs = {raw: [id, idk, src(X, id.order, idk.order, id.order, idk.order)],
                 org3d: [S.tree_q, S.tree_k, src(X, S.tree_q.order, S.tree_k.order, S.tree_q.order, S.tree_k.order)]};
  if (o2) {
    specs.org2d = [o2.rows, o2.cols, src(X, o2.rows.order, o2.cols.order, o2.rows.order, o2.cols.order)];
    specs.resid = [o2.rows, o2.cols, src(R, id.order, idk.order, o2.rows.order, o2.cols.order)];
  }
  const v = {};
  if (!d.lod) {
    Object.entries(specs).forEach(([name, [rt, ct, sr]]) => {
      if (!sr) return;
      v[name] = {z: sub(sr, 0, nq, 0, nk), r: range(nq + 1), c: range(nk + 1), rt: rt, ct: ct, src: null,
                 masked: !!A, res: "full resolution " + nq + " × " + nk};
    });
    return v;
  }
  const L = S.lod, two = d.lod.two.get(u);
  const lod = {raw: [L.raw, d.lod.raw[u]], org3d: [L.org3d, d.lod.org3[u]]};
  if (two && o2) { lod.org2d = [L.edges2d[u], two.org]; lod.resid = [L.edges2d[u], two.res]; }
  Object.entries(lod).forEach(([name, [e, z]]) => {
    const [rt, ct, sr] = specs[name], nr = e.rows.length - 1, nc = e.cols.length - 1;
    v[name] = {z: maskBlocks(reshape(z, nr, nc), A, rt.order, ct.order, e.rows, e.cols, nk), r: e.rows, c: e.cols,
               rt: rt, ct: ct, src: sr, masked: !!A,
               res: "level of detail " + nr + " × " + nc + " of " + nq + " × " + nk +
                    (sr ? "; zoom in for full resolution" : "")};
  });
  return v;
}

// -- plots -----------------------------------------------------------------------------------
// token text (decoded where the page was built: a space shows as ␣, a newline as ↵) goes into
// plotly's hover and tick labels, which read a few HTML tags: "<s>" must stay text
const escapeHtml = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
D.samples.forEach((S) => {
  S.text = S.tokens; S.key_text = S.key_tokens;
  S.tokens = S.tokens.map(escapeHtml); S.key_tokens = S.key_tokens.map(escapeHtml);
});
// a short sample's axes are labelled with its tokens, as bertviz labels a head: where each row
// (column) of the view is one token and there are at most TOKEN_TICKS, few enough for every label
// to be read across a panel (the plot grows to TICK_PX per row); positions otherwise. Long tokens
// are cut to TICK_CHARS characters.
const TOKEN_TICKS = 24, TICK_CHARS = 8, TICK_PX = 11;
function tokenAxis(text, order, e) {
  const n = e.length - 1;
  if (n > TOKEN_TICKS || e.some((x, i) => i > 0 && x - e[i - 1] !== 1)) return null;
  const cut = (t) => {
    const c = Array.from(t);
    return c.length > TICK_CHARS ? c.slice(0, TICK_CHARS - 1).join("") + "…" : t;
  };
  return {tickmode: "array", tickvals: range(n).map((i) => e[i] + 0.5),
          ticktext: range(n).map((i) => escapeHtml(cut(text[order[e[i]]]))), tickfont: {size: 9}, automargin: true};
}
function folderLabel(tokens, order, a, b) {
  if (b - a === 1) return "#" + order[a] + " " + tokens[order[a]];
  const first = order.slice(a, Math.min(b, a + 3)).map((i) => tokens[i]).join(" ");
  return (b - a) + " tokens: " + first + (b - a > 3 ? " …" : "");
}
function boundaries(tree, level) {
  const out = [];
  if (!tree.depth) return out;
  tree.depth.forEach((dp, i) => { if (dp <= level) out.push(i + 1); });
  return out;
}
function lines(view, level) {
  const x = [], y = [], nr = view.r[view.r.length - 1], nc = view.c[view.c.length - 1];
  boundaries(view.rt, level).forEach((p) => { x.push(0, nc, null); y.push(p, p, null); });
  boundaries(view.ct, level).forEach((p) => { x.push(p, p, null); y.push(0, nr, null); });
  return {type: "scatter", mode: "lines", x: x, y: y, hoverinfo: "skip", showlegend: false,
          line: {color: "rgba(255,255,255,0.85)", width: 1}};
}
// the colour range of a view: over the entries the model may attend to only
function zrange(view) {
  const zr = [Infinity, -Infinity], upd = (x) => { if (x < zr[0]) zr[0] = x; if (x > zr[1]) zr[1] = x; };
  const s = view.src;
  if (s && s.A) {
    for (let i = 0; i < s.ro.length; i++) {
      const base = s.ro[i] * s.nk, mbase = s.mro[i] * s.nk;
      for (let j = 0; j < s.co.length; j++) if (s.A[mbase + s.mco[j]]) upd(s.X[base + s.co[j]]);
    }
  } else if (s) s.X.forEach(upd);
  else view.z.forEach((row) => row.forEach((x) => { if (x !== null) upd(x); }));
  return zr[0] <= zr[1] ? zr : null;  // null: nothing allowed
}
const fmt = (x) => x === null ? "masked (the model does not attend here)" : "value " + (+x).toPrecision(4);
const TITLES = {raw: "raw head (token order)", org3d: "network's 3-D organization",
                org2d: "own 2-D organization", resid: "paraproduct residual (softmax − approx.)"};
// the heatmap of a view: its base, or inside a zoom window `w` the full-resolution block
function heatmap(name, view, zr, pos, w) {
  const S = D.samples[pos];
  let z = view.z, r = view.r, c = view.c, res = view.res;
  if (w) {
    z = sub(view.src, w.r0, w.r1, w.c0, w.c1); r = range(w.r1 - w.r0 + 1).map((i) => i + w.r0);
    c = range(w.c1 - w.c0 + 1).map((j) => j + w.c0);
    res = "full resolution, rows " + w.r0 + "–" + w.r1 + ", columns " + w.c0 + "–" + w.c1;
  }
  const nr = r.length - 1, nc = c.length - 1;
  const rl = range(nr).map((i) => folderLabel(S.tokens, view.rt.order, r[i], r[i + 1]));
  const cl = range(nc).map((j) => folderLabel(S.key_tokens, view.ct.order, c[j], c[j + 1]));
  const heat = {type: "heatmap", z: z, x: c, y: r, hoverongaps: true,
    text: rl.map((a, i) => cl.map((b, j) => "query " + a + "<br>key " + b + "<br>" + fmt(z[i][j]))),
    hovertemplate: "%{text}<extra></extra>", colorbar: {thickness: 10}};
  Object.assign(heat, name === "resid" ? {colorscale: RESID_SCALE, zmid: 0,
    zmin: -Math.max(1e-12, -zr[0], zr[1]), zmax: Math.max(1e-12, -zr[0], zr[1])} :
    {colorscale: "Viridis", zmin: zr[0], zmax: zr[1]});
  return [heat, res, r, c];
}
// the note in a view's panel where the view has nothing to show (`lines`; null: none). An HTML
// paragraph over the empty plot, so that a long list of heads wraps inside the panel
function absentNote(name, lines) {
  const panel = $("view-" + name).parentElement;
  let note = panel.querySelector(".absent");
  if (!note && !lines) return;
  if (!note) {
    note = document.createElement("p"); note.className = "absent"; note.id = "absent-" + name;
    note.appendChild(document.createElement("span")); panel.appendChild(note);
  }
  note.hidden = !lines;
  if (lines) note.firstChild.textContent = lines.join("\n");
}
function drawView(name, view, zr, pos) {
  const div = $("view-" + name);
  div._oattn = view ? {view: view, zr: zr, pos: pos, w: null} : null;
  absentNote(name, view ? null : ["2-D organization not computed for " + unitName(state.unit) + ".",
    // a head's name kept on one line (a no-break space)
    "Computed for " + M.units_2d.length + " heads: " + M.units_2d.map((v) => unitName(v).replace(" ", "\u00a0"))
      .join(", ")]);
  if (!view) {
    return Plotly.react(div, [], {title: {text: TITLES[name], font: {size: 13}}, xaxis: {visible: false},
      yaxis: {visible: false}, margin: {l: 10, r: 10, t: 40, b: 10}, height: 340}, PCONF);
  }
  return redraw(name, null);
}
function redraw(name, w) {
  const div = $("view-" + name), st = div._oattn, view = st.view;
  st.w = w;
  const [heat, res, r, c] = heatmap(name, view, st.zr, st.pos, w), S = D.samples[st.pos];
  const xt = tokenAxis(S.key_text, view.ct.order, c), yt = tokenAxis(S.text, view.rt.order, r);
  const nr = view.r[view.r.length - 1], nc = view.c[view.c.length - 1];
  const xr = w ? [w.c0, w.c1] : [0, nc], yr = w ? [w.r1, w.r0] : [nr, 0];
  const layout = {title: {text: TITLES[name] + ", " + unitName(state.unit) + "<br><sub>" + res +
      (view.masked ? "; grey: masked by the model" : "") + "</sub>", font: {size: 13}},
    plot_bgcolor: MASKED_BG,
    margin: {l: 40, r: 10, t: 50, b: 30}, height: yt ? Math.max(340, 140 + TICK_PX * (r.length - 1)) : 340,
    uirevision: st.pos + ":" + state.unit + ":" + (w ? 1 : 0),
    xaxis: {title: {text: "key", standoff: 2}, range: xr, constrain: "domain", ...xt},
    yaxis: {title: {text: "query", standoff: 2}, range: yr, ...yt}};
  st.busy = true;
  return Plotly.react(div, name === "raw" ? [heat] : [heat, lines(view, state.level)], layout, PCONF)
    .finally(() => { st.busy = false; });
}
// a zoom (plotly's own, or a click into a folder): full resolution inside it where the head has it
function onZoom(name, ev) {
  const div = $("view-" + name), st = div._oattn;
  if (!st || st.busy || !st.view.src) return;
  if (ev && ev["xaxis.autorange"]) return schedule(() => redraw(name, null));  // a double click: zoom out
  const v = st.view, nr = v.r[v.r.length - 1], nc = v.c[v.c.length - 1], xa = div.layout.xaxis.range,
    ya = div.layout.yaxis.range;
  const c0 = Math.max(0, Math.floor(Math.min(...xa))), c1 = Math.min(nc, Math.ceil(Math.max(...xa)));
  const r0 = Math.max(0, Math.floor(Math.min(...ya))), r1 = Math.min(nr, Math.ceil(Math.max(...ya)));
  const whole = c0 === 0 && r0 === 0 && c1 === nc && r1 === nr;
  const w = whole || (r1 - r0) * (c1 - c0) > ZOOM_CELLS ? null : {r0: r0, r1: r1, c0: c0, c1: c1};
  if (w || st.w) schedule(() => redraw(name, w));
}
function zoomFolder(name, ev) {
  const div = $("view-" + name), st = div._oattn;
  if (!st || !ev.points.length) return;
  const v = st.view, p = ev.points[0], at = (tree, n, x) => {
    const b = [0, ...boundaries(tree, state.level), n];
    let i = 0;
    while (i + 1 < b.length - 1 && b[i + 1] <= x) i++;
    return [b[i], b[i + 1]];
  };
  const nr = v.r[v.r.length - 1], nc = v.c[v.c.length - 1];
  const [r0, r1] = at(v.rt, nr, p.y), [c0, c1] = at(v.ct, nc, p.x);
  if (v.src && (r1 - r0) * (c1 - c0) <= ZOOM_CELLS) return schedule(() => redraw(name, {r0: r0, r1: r1, c0: c0, c1: c1}));
  return schedule(() => Plotly.relayout(div, {"xaxis.range": [c0, c1], "yaxis.range": [r1, r0]}));
}
function gridColumns() {
  if (!M.kv_group) return range(NH);
  return range(NH).sort((a, b) => (M.kv_group[a] - M.kv_group[b]) || (a - b));
}
function drawGrid() {
  const cols = gridColumns(), vals = D.metrics[state.metric][state.sample];
  const z = range(NL).map((l) => cols.map((h) => vals[l * NH + h]));
  const tx = range(NL).map((l) => cols.map((h) => "layer " + LID[l] + ", head " + HID[h] +
    (M.kv_group ? " (KV group " + M.kv_group[l * NH + h] + ")" : "") +
    (M.units_2d.includes(l * NH + h) ? "<br>2-D organization computed" : "")));
  const col = cols.indexOf(state.unit % NH), lay = Math.floor(state.unit / NH);
  const shapes = [{type: "rect", x0: col - 0.5, x1: col + 0.5, y0: lay - 0.5, y1: lay + 0.5,
                   line: {color: "#e8112d", width: 3}}];
  if (M.kv_group) {
    cols.forEach((h, i) => { if (i > 0 && M.kv_group[h] !== M.kv_group[cols[i - 1]]) {
      shapes.push({type: "line", x0: i - 0.5, x1: i - 0.5, y0: -0.5, y1: NL - 0.5, line: {color: "#fff", width: 2}});
    } });
  }
  const dots = {type: "scatter", mode: "markers", hoverinfo: "skip", showlegend: false,
    x: M.units_2d.map((u) => cols.indexOf(u % NH)), y: M.units_2d.map((u) => Math.floor(u / NH)),
    marker: {symbol: "circle", size: 5, color: "#fff", line: {color: "#000", width: 1}}};
  return Plotly.react($("grid"), [{type: "heatmap", z: z, x: range(cols.length), y: range(NL), text: tx,
    hovertemplate: "%{text}<br>" + state.metric + ": %{z:.4g}<extra></extra>", colorscale: "Cividis",
    colorbar: {thickness: 10}}, dots], {margin: {l: 50, r: 10, t: 10, b: 50}, height: 320, shapes: shapes,
    xaxis: {title: {text: M.kv_group ? "head (grouped by KV head)" : "head"}, tickvals: range(cols.length),
            ticktext: cols.map((h) => M.kv_group ? HID[h] + "·g" + M.kv_group[h] : String(HID[h]))},
    yaxis: {title: {text: "layer"}, autorange: "reversed", tickvals: range(NL), ticktext: LID.map(String)}}, PCONF);
}
function drawDiffusion() {
  const S = D.samples[state.sample], tl = S.tree_h.length - 1, lev = Math.min(state.level, tl);
  const colour = {layer: layerOf, kv: (u) => M.kv_group[u],
    folder: (u) => S.tree_h[lev][u], metric: (u) => D.metrics[state.metric][state.sample][u]}[state.colorBy];
  const us = range(NU), x = us.map((u) => S.diffusion[u][0]), y = us.map((u) => S.diffusion[u][1]);
  const title = {layer: "layer", kv: "KV group", folder: "head-tree folder (level " + lev + ")",
                 metric: "grid metric"}[state.colorBy];
  const pts = {type: "scatter", mode: "markers", x: x, y: y, customdata: us, name: "heads",
    text: us.map((u) => unitName(u) + " · head-tree folder " + S.tree_h[lev][u]),
    hovertemplate: "%{text}<br>ψ1 %{x:.3g}, ψ2 %{y:.3g}<extra></extra>",
    marker: {size: 9, color: us.map(colour), colorscale: state.colorBy === "metric" ? "Cividis" : "Portland",
             colorbar: {title: {text: title, side: "right"}, thickness: 10}, line: {color: "#333", width: 0.5}}};
  const sel = {type: "scatter", mode: "markers", x: [x[state.unit]], y: [y[state.unit]], hoverinfo: "skip",
    name: "selected", marker: {size: 18, symbol: "circle-open", color: "#e8112d", line: {width: 3}}};
  return Plotly.react($("dmap"), [pts, sel], {margin: {l: 50, r: 10, t: 10, b: 40}, height: 320,
    showlegend: false, hovermode: "closest", uirevision: "dmap" + state.sample,
    xaxis: {title: {text: "ψ1"}}, yaxis: {title: {text: "ψ2"}}}, PCONF);
}
function drawInfo() {
  const u = state.unit, S = D.samples[state.sample], o2 = S.o2d[u], f = (v) => v == null ? "–" : (+v).toPrecision(4);
  const parts = ["<b>" + unitName(u) + "</b> (layer " + layerOf(u) + ", head " + headOf(u) +
    (M.kv_group ? ", KV group " + M.kv_group[u] : "") + ")", "sample " + S.sample +
    (S.info.label != null ? " (image label " + S.info.label + ")" : "")];
  metricNames.forEach((m) => parts.push(m + ": " + f(D.metrics[m][state.sample][u])));
  if (o2) parts.push("paraproduct relative residual: organized " + f(o2.rel) + ", unorganized " + f(o2.rel_unorganized));
  // the stability stage's replicates of this sample (docs/method.md §14): the head's entropy range
  const R = D.entropy_ranges ? D.entropy_ranges[state.sample] : null;
  if (R && R.lo[u] != null) {
    const n = {};
    R.perturbations.forEach((p) => { n[p] = (n[p] || 0) + 1; });
    const what = Object.keys(n).map((p) => p === "none" ? "reference" : p + (n[p] > 1 ? " ×" + n[p] : "")).join(", ");
    parts.push("<span id='entropy-range'>Haar entropy over " + R.perturbations.length + " replicates (" + what + "): " +
      f(R.lo[u]) + " – " + f(R.hi[u]) + "</span>");
  } else if (D.entropy_ranges) {
    parts.push("<span id='entropy-range'>Haar entropy: this sample has no stability replicates</span>");
  }
  $("info").innerHTML = parts.join(" · ");
}
function drawTables() {
  document.querySelectorAll("#tables tbody tr").forEach((tr) => {
    const on = (tr.dataset.unit !== undefined && +tr.dataset.unit === state.unit) ||
      (tr.dataset.sample !== undefined && +tr.dataset.sample === D.samples[state.sample].sample) ||
      (tr.dataset.metric !== undefined && tr.dataset.metric === state.metric);
    tr.classList.toggle("sel", on);
  });
}

// -- rendering, serialised -------------------------------------------------------------------
let pending = Promise.resolve(), renders = 0;
async function renderNow() {
  const pos = state.sample, v = await views(pos, state.unit);
  const zr = [Infinity, -Infinity];
  [v.raw, v.org3d, v.org2d].filter(Boolean).map(zrange).filter(Boolean).forEach(([a, b]) => {
    zr[0] = Math.min(zr[0], a); zr[1] = Math.max(zr[1], b); });
  if (zr[0] > zr[1]) { zr[0] = 0; zr[1] = 0; }
  await Promise.all([drawGrid(), drawDiffusion(),
    ...VIEWS.map((n) => drawView(n, v[n], n === "resid" && v[n] ? zrange(v[n]) || [0, 0] : zr, pos))]);
  drawInfo(); drawTables();
}
// every change of what the page shows goes through here, one at a time
function schedule(task) {
  pending = pending.then(task || renderNow).then(() => {
    renders += 1;
    document.body.dataset.rendered = String(renders);
  }).catch((e) => { console.error(e); });
  return pending;
}
function select(u) { state.unit = +u; $("head").value = String(state.unit); return schedule(); }
function setSample(pos) { state.sample = +pos; $("sample").value = String(pos); return schedule(); }
function setMetric(m) { if (D.metrics[m]) { state.metric = m; $("metric").value = m; } return schedule(); }

// -- controls and tables ----------------------------------------------------------------------
function option(sel, value, text) {
  const o = document.createElement("option"); o.value = value; o.textContent = text; sel.appendChild(o);
}
function setupControls() {
  D.samples.forEach((S, i) => option($("sample"), i, "sample " + S.sample));
  range(NU).forEach((u) => option($("head"), u, unitName(u) + (M.units_2d.includes(u) ? " ◆" : "")));
  metricNames.forEach((m) => option($("metric"), m, m));
  [["layer", "layer"], ["folder", "head-tree folder"], ["metric", "grid metric"]].concat(
    M.kv_group ? [["kv", "KV group"]] : []).forEach(([k, t]) => option($("colorby"), k, t));
  const depth = Math.max(2, ...D.samples.map((S) => S.tree_h.length - 1),
    ...D.samples.flatMap((S) => [S.tree_q, S.tree_k].map((t) => Math.max(0, ...t.depth))));
  $("level").max = String(depth); $("level").value = String(state.level);
  $("level-value").textContent = String(state.level);
  $("head").value = String(state.unit);
  $("sample").onchange = (e) => setSample(e.target.value);
  $("head").onchange = (e) => select(e.target.value);
  $("metric").onchange = (e) => setMetric(e.target.value);
  $("colorby").onchange = (e) => { state.colorBy = e.target.value; schedule(); };
  $("level").oninput = (e) => { state.level = +e.target.value; $("level-value").textContent = e.target.value; schedule(); };
  $("reset-zoom").onclick = () => schedule(() => Promise.all(VIEWS.filter((n) => $("view-" + n)._oattn)
    .map((n) => redraw(n, null).then(() => {
      const v = $("view-" + n)._oattn.view, st = $("view-" + n)._oattn;
      st.busy = true;
      return Plotly.relayout($("view-" + n), {"xaxis.range": [0, v.c[v.c.length - 1]],
        "yaxis.range": [v.r[v.r.length - 1], 0]}).finally(() => { st.busy = false; });
    }))));
}
function setupTables() {
  D.tables.forEach((T, ti) => {
    const box = document.createElement("section"), t = document.createElement("table");
    box.innerHTML = "<h3>" + T.title + "</h3>" + (T.note ? "<p class='note'>" + T.note + "</p>" : "");
    t.id = "table-" + ti;
    const head = document.createElement("tr");
    T.columns.forEach((c, ci) => {
      const th = document.createElement("th"); th.textContent = c; th.dataset.col = ci;
      th.onclick = () => sortTable(t, ci, th); head.appendChild(th);
    });
    const thead = document.createElement("thead"); thead.appendChild(head); t.appendChild(thead);
    const body = document.createElement("tbody"), li = T.columns.indexOf("layer"), hi = T.columns.indexOf("head");
    T.rows.forEach((row) => {
      const tr = document.createElement("tr");
      row.forEach((v) => { const td = document.createElement("td"); td.textContent = v == null ? "" :
        (typeof v === "number" && !Number.isInteger(v) ? v.toPrecision(4) : String(v));
        td.dataset.v = v == null ? "" : String(v); tr.appendChild(td); });
      if (T.select === "head" && li >= 0 && hi >= 0 && unitOf(row[li], row[hi]) >= 0) {
        // tables name heads by the model's indices
        tr.dataset.unit = unitOf(row[li], row[hi]); tr.onclick = () => select(tr.dataset.unit);
      } else if (T.select === "sample") {
        const s = row[T.columns.indexOf("sample")], pos = D.samples.findIndex((S) => S.sample === s);
        tr.dataset.sample = s; if (pos >= 0) tr.onclick = () => setSample(pos);
      } else if (T.select === "ranking") {
        const r = String(row[T.columns.indexOf("ranking")]);
        const m = r.startsWith("Haar entropy") ? metricNames[0] : "ablation: " + r;
        if (D.metrics[m]) { tr.dataset.metric = m; tr.onclick = () => setMetric(m); }
      }
      body.appendChild(tr);
    });
    t.appendChild(body); box.appendChild(t); $("tables").appendChild(box);
  });
}
function sortTable(t, ci, th) {
  const dir = th.dataset.dir === "asc" ? "desc" : "asc";
  t.querySelectorAll("th").forEach((h) => { delete h.dataset.dir; });
  th.dataset.dir = dir;
  const rows = Array.from(t.tBodies[0].rows), key = (r) => r.cells[ci].dataset.v;
  const num = rows.every((r) => key(r) === "" || !isNaN(+key(r)));
  rows.sort((a, b) => {
    const x = key(a), y = key(b), c = num ? (+x || 0) - (+y || 0) : x.localeCompare(y);
    return dir === "asc" ? c : -c;
  });
  rows.forEach((r) => t.tBodies[0].appendChild(r));
}

setupControls();
setupTables();
const ready = schedule().then(() => {
  $("grid").on("plotly_click", (ev) => {
    const p = ev.points[0]; if (!p || p.data.type !== "heatmap") return;
    select(Math.round(p.y) * NH + gridColumns()[Math.round(p.x)]);
  });
  $("dmap").on("plotly_click", (ev) => {
    const p = ev.points.find((q) => q.data.name === "heads"); if (p) select(p.customdata);
  });
  ["org3d", "org2d", "resid"].forEach((n) => $("view-" + n).on("plotly_click", (ev) => zoomFolder(n, ev)));
  VIEWS.forEach((n) => $("view-" + n).on("plotly_relayout", (ev) => onZoom(n, ev)));
  document.body.dataset.ready = "1";
});
window.oattn = {data: D, state: state, select: select, setSample: setSample, setMetric: setMetric,
                ready: ready, idle: () => pending};
})();
