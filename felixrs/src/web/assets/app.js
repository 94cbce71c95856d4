// felixrs web view: live flows from /flows (NDJSON), per-policy hits from /api/policies,
// per-pod policies from /api/pods. Text reaches the DOM only through textContent and
// createElement (never as HTML); the page's Content-Security-Policy forbids inline script.
'use strict';

(() => {
  const MAX_FLOWS = 5000; // records kept in the browser (oldest dropped)
  const MAX_ROWS = 500; // rows drawn at once (newest first)
  const POLL_MS = 3000; // policies/pods refresh while shown

  const VIEWS = ['flows', 'policies', 'pods'];
  const state = { view: 'flows', ns: '', pod: '', verdict: '', policy: '', staged: false };
  const flows = []; // {rec, line, seenAt}, oldest first
  const seen = new Set(); // the lines kept, to drop the repeats of a reconnect
  let drawPending = false;

  const $ = (id) => document.getElementById(id);

  // --- DOM helpers: text only -------------------------------------------------------------
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent, ...children) {
    for (const c of children) if (c) parent.appendChild(c);
    return parent;
  }
  function str(v) {
    return v === undefined || v === null ? '' : String(v);
  }

  // --- the URL hash holds the view and the filters --------------------------------------------
  function readHash() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ''));
    const view = p.get('view');
    state.view = VIEWS.includes(view) ? view : 'flows';
    state.ns = p.get('ns') || '';
    state.pod = p.get('pod') || '';
    state.verdict = ['allow', 'deny'].includes(p.get('verdict')) ? p.get('verdict') : '';
    state.policy = p.get('policy') || '';
    state.staged = p.get('staged') === '1';
  }
  function writeHash() {
    const p = new URLSearchParams();
    if (state.view !== 'flows') p.set('view', state.view);
    for (const k of ['ns', 'pod', 'verdict', 'policy']) if (state[k]) p.set(k, state[k]);
    if (state.staged) p.set('staged', '1');
    const h = p.toString();
    const want = h ? '#' + h : '';
    if (location.hash !== want) history.replaceState(null, '', want || location.pathname);
  }
  function syncInputs() {
    $('f-ns').value = state.ns;
    $('f-pod').value = state.pod;
    $('f-verdict').value = state.verdict;
    $('f-policy').value = state.policy;
    $('f-staged').checked = state.staged;
    for (const b of document.querySelectorAll('#tabs button')) {
      b.classList.toggle('active', b.dataset.view === state.view);
      b.setAttribute('aria-pressed', b.dataset.view === state.view ? 'true' : 'false');
    }
    for (const v of VIEWS) $('view-' + v).hidden = v !== state.view;
    const filtering = state.ns || state.pod || state.verdict || state.policy || state.staged;
    $('f-clear').disabled = !filtering;
  }
  function setFilter(changes) {
    Object.assign(state, changes);
    writeHash();
    syncInputs();
    redraw();
  }

  // --- names ---------------------------------------------------------------------------------
  const KIND_SHORT = {
    NetworkPolicy: 'NP',
    GlobalNetworkPolicy: 'GNP',
    StagedNetworkPolicy: 'SNP',
    StagedGlobalNetworkPolicy: 'SGNP',
    StagedKubernetesNetworkPolicy: 'SKNP',
    Profile: 'profile',
    EndOfTier: 'end of tier',
    NoProfile: 'no profile',
  };
  function hitName(h) {
    if (!h) return '';
    if (h.kind === 'EndOfTier') return str(h.tier || h.name);
    if (h.kind === 'NoProfile') return '';
    return h.namespace ? h.namespace + '/' + h.name : str(h.name);
  }
  function deciding(hits) {
    if (!hits || hits.length === 0) return null;
    for (let i = hits.length - 1; i >= 0; i--) if (hits[i].action !== 'pass') return hits[i];
    return hits[hits.length - 1];
  }
  function hitsText(hits) {
    return (hits || [])
      .map((h) => {
        const tier = h.tier ? ' [' + h.tier + ']' : '';
        const rule = h.rule_index !== undefined && h.rule_index !== null ? ' rule ' + h.rule_index : '';
        return str(h.kind) + tier + ' ' + hitName(h) + ' → ' + str(h.action) + rule;
      })
      .join('\n');
  }
  function endName(e) {
    if (!e) return '';
    if (e.name) return e.namespace ? e.namespace + '/' + e.name : str(e.name);
    return str(e.ip);
  }
  function addrText(e) {
    if (!e || e.ip === undefined || e.ip === null) return '';
    const ip = String(e.ip).includes(':') ? '[' + e.ip + ']' : String(e.ip);
    return e.port !== undefined && e.port !== null ? ip + ':' + e.port : ip;
  }
  function labelsText(labels) {
    return Object.entries(labels || {})
      .map(([k, v]) => k + '=' + v)
      .join('\n');
  }

  // --- filters -------------------------------------------------------------------------------
  function stagedWouldDeny(r) {
    return r.pending_action === 'deny' && r.action === 'allow';
  }
  function matches(r) {
    const lc = (s) => str(s).toLowerCase();
    if (state.ns && r.source?.namespace !== state.ns && r.dest?.namespace !== state.ns) return false;
    if (state.pod) {
      const q = lc(state.pod);
      const ends = [r.source, r.dest].filter(Boolean);
      if (!ends.some((e) => lc(e.name).includes(q) || lc(endName(e)).includes(q))) return false;
    }
    if (state.verdict && r.action !== state.verdict) return false;
    if (state.policy) {
      const q = lc(state.policy);
      const hits = [...(r.policies?.enforced || []), ...(r.policies?.pending || [])];
      if (!hits.some((h) => lc(hitName(h)).includes(q) || lc(h.name).includes(q))) return false;
    }
    if (state.staged && !stagedWouldDeny(r)) return false;
    return true;
  }

  // --- the flow stream -----------------------------------------------------------------------
  function setConn(s, text) {
    const c = $('conn');
    c.dataset.state = s;
    c.textContent = text;
  }
  function addLine(line) {
    if (seen.has(line)) return;
    let rec;
    try {
      rec = JSON.parse(line);
    } catch (_) {
      return;
    }
    if (!rec || typeof rec !== 'object') return;
    seen.add(line);
    flows.push({ rec, line, seenAt: new Date() });
    while (flows.length > MAX_FLOWS) seen.delete(flows.shift().line);
    scheduleDraw();
  }
  async function stream() {
    let wait = 500;
    for (;;) {
      setConn('connecting', 'connecting');
      try {
        const res = await fetch('/flows', { cache: 'no-store' });
        if (!res.ok || !res.body) throw new Error('HTTP ' + res.status);
        setConn('live', 'live');
        wait = 500;
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, i).trim();
            buf = buf.slice(i + 1);
            if (line) addLine(line);
          }
        }
      } catch (_) {
        // reconnect below
      }
      setConn('down', 'reconnecting');
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(wait * 2, 10000);
    }
  }

  // --- drawing the flows ---------------------------------------------------------------------
  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    setTimeout(() => {
      drawPending = false;
      drawFlows();
    }, 100);
  }
  function fmtTime(unix) {
    if (!unix) return '';
    const d = new Date(unix * 1000);
    return d.toLocaleTimeString([], { hour12: false });
  }
  function fmtNum(n) {
    n = Number(n) || 0;
    if (n >= 1e9) return (n / 1e9).toFixed(1) + 'G';
    if (n >= 1e6) return (n / 1e6).toFixed(1) + 'M';
    if (n >= 1e4) return (n / 1e3).toFixed(1) + 'k';
    return String(n);
  }
  function chip(text, cls, title, onClick) {
    const c = el(onClick ? 'button' : 'span', 'chip ' + (cls || ''), text);
    if (onClick) {
      c.type = 'button';
      c.addEventListener('click', (ev) => {
        ev.stopPropagation();
        onClick();
      });
    }
    if (title) c.title = title;
    return c;
  }
  function endCell(e) {
    const td = el('td', 'end');
    if (!e) return td;
    if (e.name) {
      const name = el('div', 'end-name');
      if (e.namespace) {
        add(name, chip(e.namespace, 'ns', 'filter on namespace ' + e.namespace, () => setFilter({ ns: e.namespace })));
      }
      add(name, chip(e.name, 'pod', 'filter on ' + e.name, () => setFilter({ pod: e.name })));
      add(td, name);
    }
    const addr = el('div', 'addr', addrText(e));
    if (e.type && e.type !== 'wep') add(addr, el('span', 'kind', ' ' + e.type));
    add(td, addr);
    const labels = labelsText(e.labels);
    if (labels) td.title = labels;
    return td;
  }
  function verdictBadge(action, cls) {
    return el('span', 'badge v-' + str(action) + (cls ? ' ' + cls : ''), str(action));
  }
  function policyCell(hits) {
    const td = el('td', 'policy');
    const h = deciding(hits);
    if (!h) return td;
    add(td, el('span', 'kind', KIND_SHORT[h.kind] || str(h.kind)));
    const name = hitName(h);
    if (name) add(td, chip(name, 'pol', 'filter on policy ' + name, () => setFilter({ policy: name })));
    if (h.tier && h.kind !== 'EndOfTier') add(td, el('span', 'tier', h.tier));
    td.title = hitsText(hits);
    return td;
  }
  function stagedCell(r) {
    const td = el('td', 'staged');
    if (!r.pending_action) {
      td.textContent = '—';
      td.classList.add('muted');
      return td;
    }
    if (r.pending_action === r.action) {
      add(td, el('span', 'muted', 'same'));
    } else {
      add(td, el('span', 'badge staged-' + str(r.pending_action), 'would ' + str(r.pending_action)));
      const h = deciding(r.policies?.pending);
      if (h) add(td, el('span', 'staged-by', ' ' + hitName(h)));
    }
    td.title = hitsText(r.policies?.pending);
    return td;
  }
  function flowRow(f) {
    const r = f.rec;
    const tr = el('tr', 'flow v-row-' + str(r.action));
    tr.dataset.verdict = str(r.action);
    if (stagedWouldDeny(r)) tr.classList.add('staged-deny-row');
    add(
      tr,
      el('td', 'time', fmtTime(r.end_time || r.start_time)),
      add(el('td', 'verdict'), verdictBadge(r.action)),
      endCell(r.source),
      endCell(r.dest),
      el('td', 'proto', str(r.proto) + (r.dest && r.dest.port ? '/' + r.dest.port : '')),
      policyCell(r.policies?.enforced),
      stagedCell(r),
      el('td', 'num', fmtNum(r.packets_in) + ' / ' + fmtNum(r.packets_out)),
      el('td', 'num', fmtNum(r.bytes_in) + ' / ' + fmtNum(r.bytes_out)),
      el('td', 'reporter muted', str(r.host) + (r.reporter ? ' (' + r.reporter + ')' : '')),
    );
    return tr;
  }
  function drawStats() {
    let allow = 0;
    let deny = 0;
    let staged = 0;
    const ns = new Set();
    for (const f of flows) {
      if (f.rec.action === 'deny') deny++;
      else if (f.rec.action === 'allow') allow++;
      if (stagedWouldDeny(f.rec)) staged++;
      for (const e of [f.rec.source, f.rec.dest]) if (e && e.namespace) ns.add(e.namespace);
    }
    $('stat-flows').textContent = String(flows.length);
    $('stat-allow').textContent = String(allow);
    $('stat-deny').textContent = String(deny);
    $('stat-staged').textContent = String(staged);
    const list = $('ns-list');
    if (list.childElementCount !== ns.size) {
      list.replaceChildren(...[...ns].sort().map((n) => {
        const o = document.createElement('option');
        o.value = n;
        return o;
      }));
    }
  }
  function drawFlows() {
    drawStats();
    if (state.view !== 'flows') return;
    const rows = [];
    let matching = 0;
    for (let i = flows.length - 1; i >= 0; i--) {
      if (!matches(flows[i].rec)) continue;
      matching++;
      if (rows.length < MAX_ROWS) rows.push(flowRow(flows[i]));
    }
    $('flows-body').replaceChildren(...rows);
    $('flows-empty').hidden = rows.length > 0;
    $('flows-empty').textContent = flows.length
      ? 'No flow matches the filters.'
      : 'No flows yet. Flows appear here as the agent records them.';
    const shown = matching > rows.length ? ', newest ' + rows.length + ' shown' : '';
    $('flows-count').textContent =
      matching + ' of ' + flows.length + ' flows match' + shown + ' (newest first; this page keeps the last ' + MAX_FLOWS + ').';
  }

  // --- policies ------------------------------------------------------------------------------
  let policiesDoc = null;
  function policyRow(p, maxPackets) {
    const name = hitName(p) || '(no profile matched)';
    const tr = el('tr', 'policy-row');
    const staged = (p.staged?.would_deny || 0) + (p.staged?.would_allow || 0);
    if (staged > 0) tr.classList.add('staged-row');
    if (p.kind === 'EndOfTier' || p.kind === 'NoProfile') tr.classList.add('end-row');
    const first = el('td', 'policy');
    add(first, el('span', 'kind', KIND_SHORT[p.kind] || str(p.kind)));
    add(first, chip(name, 'pol', 'show the flows of ' + name, () => setFilter({ view: 'flows', policy: hitName(p) })));
    const bar = el('div', 'bar');
    const fill = el('div', 'fill');
    fill.style.width = (maxPackets ? Math.max(1, Math.round((100 * (p.packets || 0)) / maxPackets)) : 0) + '%';
    if ((p.counters || []).some((c) => c.action === 'deny')) fill.classList.add('deny');
    add(bar, fill);
    const counters = el('td', 'counters');
    for (const c of p.counters || []) {
      add(counters, el('span', 'counter a-' + str(c.action), str(c.direction) + ' ' + str(c.action) + ' ' + fmtNum(c.packets)));
    }
    add(
      tr,
      first,
      el('td', 'tier', str(p.tier)),
      el('td', 'num packets', fmtNum(p.packets)),
      add(el('td', 'bar-col'), bar),
      counters,
      el('td', 'num', String(p.flows?.allow || 0)),
      el('td', 'num' + (p.flows?.deny ? ' deny-text' : ''), String(p.flows?.deny || 0)),
      el('td', 'num staged-deny' + (p.staged?.would_deny ? ' hot' : ''), String(p.staged?.would_deny || 0)),
      el('td', 'num staged-allow', String(p.staged?.would_allow || 0)),
    );
    tr.dataset.kind = str(p.kind);
    tr.dataset.name = name;
    return tr;
  }
  function policyMatches(p) {
    const q = state.policy.toLowerCase();
    if (q && !hitName(p).toLowerCase().includes(q)) return false;
    if (state.ns && p.namespace && p.namespace !== state.ns) return false;
    if (state.staged && !(p.staged?.would_deny > 0)) return false;
    return true;
  }
  function drawPolicies() {
    if (!policiesDoc) return;
    const list = (policiesDoc.policies || []).filter(policyMatches);
    const maxPackets = Math.max(0, ...list.map((p) => p.packets || 0));
    $('policies-body').replaceChildren(...list.map((p) => policyRow(p, maxPackets)));
    $('policies-empty').hidden = list.length > 0;
    $('policies-note').textContent =
      list.length + ' policies, profiles and tier ends. Packets: the kernel counters the agent reads; flows and staged differences: over the ' +
      policiesDoc.flows_kept + ' flow records the agent keeps.';
  }
  async function loadPolicies() {
    try {
      const res = await fetch('/api/policies', { cache: 'no-store' });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      policiesDoc = await res.json();
      if (policiesDoc.node) $('node').textContent = policiesDoc.node;
      drawPolicies();
    } catch (e) {
      $('policies-note').textContent = 'Cannot read /api/policies: ' + e.message;
    }
  }

  // --- pods ----------------------------------------------------------------------------------
  let podsDoc = null;
  function tierList(tiers) {
    const box = el('div', 'tiers');
    if (!tiers || tiers.length === 0) {
      add(box, el('p', 'muted', 'no policy: the profiles decide'));
      return box;
    }
    for (const t of tiers) {
      const tier = el('div', 'tier-box');
      add(tier, add(el('div', 'tier-head'), el('span', 'tier-name', t.tier), el('span', 'muted', ' · unmatched: ' + str(t.default_action))));
      const ol = el('ol', 'tier-policies');
      for (const p of t.policies || []) {
        const name = p.namespace ? p.namespace + '/' + p.name : str(p.name);
        add(ol, add(el('li'), el('span', 'kind', KIND_SHORT[p.kind] || str(p.kind)), chip(name, 'pol', 'show the flows of ' + name, () => setFilter({ view: 'flows', policy: name }))));
      }
      add(tier, ol);
      add(box, tier);
    }
    return box;
  }
  function podFlowCounts() {
    const counts = new Map();
    for (const f of flows) {
      for (const e of [f.rec.source, f.rec.dest]) {
        if (!e || !e.name) continue;
        const k = str(e.namespace) + '/' + e.name;
        const c = counts.get(k) || { allow: 0, deny: 0 };
        if (f.rec.action === 'deny') c.deny++;
        else c.allow++;
        counts.set(k, c);
      }
    }
    return counts;
  }
  function podCard(p, counts) {
    const card = el('article', 'pod-card');
    card.dataset.pod = p.namespace + '/' + p.pod;
    const head = el('header', 'pod-head');
    add(head, chip(p.namespace, 'ns', 'filter on namespace ' + p.namespace, () => setFilter({ ns: p.namespace })));
    add(head, el('h2', 'pod-name', p.pod));
    const c = counts.get(p.namespace + '/' + p.pod);
    if (c) {
      add(head, chip(c.allow + ' allowed', 'v-allow', null, () => setFilter({ view: 'flows', ns: p.namespace, pod: p.pod, verdict: 'allow' })));
      add(head, chip(c.deny + ' denied', 'v-deny', null, () => setFilter({ view: 'flows', ns: p.namespace, pod: p.pod, verdict: 'deny' })));
    }
    add(card, head);
    add(card, el('div', 'pod-meta muted', (p.addresses || []).join(', ') + ' · ' + str(p.interface) + ' · ' + str(p.endpoint)));
    const labels = el('div', 'labels');
    for (const [k, v] of Object.entries(p.labels || {})) add(labels, el('span', 'label', k + '=' + v));
    add(card, labels);
    const dirs = el('div', 'dirs');
    add(dirs, add(el('section', 'dir ingress'), el('h3', null, 'Ingress'), tierList(p.ingress)));
    add(dirs, add(el('section', 'dir egress'), el('h3', null, 'Egress'), tierList(p.egress)));
    add(card, dirs);
    add(card, el('div', 'profiles muted', 'profiles: ' + ((p.profiles || []).join(', ') || 'none')));
    return card;
  }
  function drawPods() {
    if (!podsDoc) return;
    const counts = podFlowCounts();
    const q = state.pod.toLowerCase();
    const list = (podsDoc.pods || []).filter(
      (p) => (!state.ns || p.namespace === state.ns) && (!q || str(p.pod).toLowerCase().includes(q)),
    );
    $('pods').replaceChildren(...list.map((p) => podCard(p, counts)));
    $('pods-empty').hidden = list.length > 0;
    $('pods-note').textContent =
      podsDoc.revision === null || podsDoc.revision === undefined
        ? 'The agent has applied nothing yet.'
        : list.length + ' of ' + (podsDoc.pods || []).length + ' pods, with the policies the kernel holds for them, by direction and tier, in evaluation order.';
  }
  async function loadPods() {
    try {
      const res = await fetch('/api/pods', { cache: 'no-store' });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      podsDoc = await res.json();
      $('node').textContent = str(podsDoc.node);
      $('revision').textContent = podsDoc.revision === null ? 'nothing applied yet' : 'revision ' + podsDoc.revision;
      drawPods();
    } catch (e) {
      $('pods-note').textContent = 'Cannot read /api/pods: ' + e.message;
    }
  }

  // --- wiring --------------------------------------------------------------------------------
  function redraw() {
    if (state.view === 'flows') drawFlows();
    if (state.view === 'policies') {
      drawPolicies();
      loadPolicies();
    }
    if (state.view === 'pods') {
      drawPods();
      loadPods();
    }
  }
  function init() {
    readHash();
    syncInputs();
    for (const b of document.querySelectorAll('#tabs button')) {
      b.addEventListener('click', () => setFilter({ view: b.dataset.view }));
    }
    const inputs = [
      ['f-ns', 'ns'],
      ['f-pod', 'pod'],
      ['f-policy', 'policy'],
    ];
    for (const [id, key] of inputs) {
      $(id).addEventListener('input', () => setFilter({ [key]: $(id).value.trim() }));
    }
    $('f-verdict').addEventListener('change', () => setFilter({ verdict: $('f-verdict').value }));
    $('f-staged').addEventListener('change', () => setFilter({ staged: $('f-staged').checked }));
    $('f-clear').addEventListener('click', () => setFilter({ ns: '', pod: '', verdict: '', policy: '', staged: false }));
    window.addEventListener('hashchange', () => {
      readHash();
      syncInputs();
      redraw();
    });
    setInterval(() => {
      if (document.hidden) return;
      if (state.view === 'policies') loadPolicies();
      if (state.view === 'pods') loadPods();
    }, POLL_MS);
    loadPods();
    redraw();
    stream();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
