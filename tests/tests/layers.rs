//! The dependency rule of ARCHITECTURE.md, checked on the source text of
//! every crate (`common`, `planner`, `agent`, `coordinator`):
//!
//! - no module imports another that imports it back: no cycle among the
//!   top-level modules of a crate (its `lib.rs`/`main.rs` counts as the node
//!   `(root)` for the items it defines), nor among the submodules of one
//!   folder module;
//! - the layer rules of [`RULES`]: a module must not name the modules or
//!   crates listed against it.
//!
//! Violations known today are listed in [`KNOWN_VIOLATIONS`], each with the
//! issue-13 reason; the test fails on any violation not listed, and on any
//! listed one that is gone (so the list only shrinks).
//!
//! The parser is plain Rust over the source text: comments, string literals
//! and `#[cfg(test)]` items are blanked out, then every `use` tree
//! (`use crate::{a, b::{c, d}};`, over as many lines as it takes) and every
//! path starting with `crate::`, `super::`, `self::`, a child module or (in
//! `lib.rs`/`main.rs`) a top-level module is resolved to the module it names,
//! following the `use` re-exports of the modules on the way.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

// ======================================================================
// The rules, as data. The coordinator's and the agent's restructure
// (issue 13) update these tables as their modules move.
// ======================================================================

/// Which modules of a crate a rule applies to; a module path `a` also
/// covers its submodules `a/b`.
#[derive(Debug, Clone, Copy)]
enum Modules {
    Only(&'static [&'static str]),
    AllBut(&'static [&'static str]),
}

/// What a module must not name.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// A module of the same crate (and its submodules).
    Module(&'static str),
    /// Any module of the same crate (not the crate root's own items).
    AnyModule,
    /// An external crate, by its name in paths (`aws_sdk_ec2`).
    Crate(&'static str),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Module(m) => write!(f, "module {m}"),
            Target::AnyModule => write!(f, "any module of the crate"),
            Target::Crate(c) => write!(f, "crate {c}"),
        }
    }
}

/// "In crate `krate`, the modules `from` must not name `forbidden`."
struct Rule {
    krate: &'static str,
    from: Modules,
    forbidden: &'static [Target],
    why: &'static str,
}

/// The coordinator's server side: what the operator CLI must not import
/// (it may use `types` and `tls`, which import nothing of the server).
const COORDINATOR_SERVER: &[Target] = &[
    Target::Module("app"),
    Target::Module("domain"),
    Target::Module("http"),
    Target::Module("leader"),
    Target::Module("memory"),
    Target::Module("migrate"),
    Target::Module("provider"),
    Target::Module("reconcile"),
    Target::Module("serve"),
    Target::Module("store"),
];

/// The crates that talk to a cloud.
const CLOUD_SDKS: &[Target] = &[
    Target::Crate("bollard"),
    Target::Crate("aws_sdk_ec2"),
    Target::Crate("aws_sdk_elasticloadbalancingv2"),
    Target::Crate("aws_sdk_s3"),
    Target::Crate("aws_config"),
];

/// The planner's planning modules, above its health judgement.
const PLANNERS: &[Target] = &[
    Target::Module("addons"),
    Target::Module("drain"),
    Target::Module("in_place"),
    Target::Module("pool"),
    Target::Module("provider"),
    Target::Module("rollout"),
    Target::Module("shared"),
];

const RULES: &[Rule] = &[
    Rule {
        krate: "common",
        from: Modules::Only(&["jws", "names", "pem", "process", "snapshot", "token", "units"]),
        forbidden: &[Target::AnyModule],
        why: "the leaves are the shared primitives every other module may use",
    },
    Rule {
        krate: "common",
        from: Modules::Only(&["objects"]),
        forbidden: &[Target::Module("wire"), Target::Module("api")],
        why: "the objects never use the machine protocol or the admin API bodies",
    },
    Rule {
        krate: "common",
        from: Modules::Only(&["wire"]),
        forbidden: &[Target::Module("api")],
        why: "the machine protocol never uses the admin API bodies",
    },
    Rule {
        krate: "planner",
        from: Modules::Only(&["instance"]),
        forbidden: &[Target::AnyModule],
        why: "what a provider reports is a leaf the planners and the health judgement read",
    },
    Rule {
        krate: "planner",
        from: Modules::Only(&["health"]),
        forbidden: PLANNERS,
        why: "the health judgement is below the planners: they use it, never the reverse",
    },
    Rule {
        krate: "planner",
        from: Modules::AllBut(&["fixtures"]),
        forbidden: &[Target::Module("fixtures")],
        why: "the test objects never reach the planner's own code",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["cli"]),
        forbidden: COORDINATOR_SERVER,
        why: "the operator CLI depends only on drover-common and its client",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["domain", "reconcile", "provider", "store", "types", "tls"]),
        forbidden: &[Target::Module("http"), Target::Module("cli")],
        why: "the HTTP edge and the CLI depend on the domain, never the reverse",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["domain"]),
        forbidden: &[
            Target::Module("app"),
            Target::Module("reconcile"),
            Target::Module("leader"),
            Target::Module("serve"),
            Target::Module("proxy"),
        ],
        why: "the domain is below App and the loops: what it needs of them comes in as a trait (BundleSource) or an argument",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["protocol"]),
        forbidden: &[
            Target::Module("app"),
            Target::Module("http"),
            Target::Module("store"),
            Target::Module("provider"),
            Target::Module("reconcile"),
            Target::Module("leader"),
            Target::Module("machine_service"),
            Target::Module("heartbeat_udp"),
            Target::Crate("tokio"),
        ],
        why: "the machine protocol core does no IO: it takes the machine, its cluster, the request and the time, and returns the change and the answer; machine_service does the IO around it",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["machine_service"]),
        forbidden: &[Target::Module("http"), Target::Module("heartbeat_udp")],
        why: "the IO around the machine protocol is below both edges that call it (the HTTPS handlers and the datagram receiver)",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["app"]),
        forbidden: &[
            Target::Module("provider/docker"),
            Target::Module("provider/aws"),
        ],
        why: "App holds the provider clients but never builds them: provider/clients.rs (Providers) makes the Docker connection and the EC2 clients",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["store"]),
        forbidden: &[
            Target::Module("app"),
            Target::Module("domain"),
            Target::Module("reconcile"),
            Target::Module("provider"),
        ],
        why: "the store is the bottom layer: it knows records, not what they mean",
    },
    Rule {
        krate: "coordinator",
        from: Modules::Only(&["types", "tls"]),
        forbidden: &[Target::AnyModule],
        why: "what the CLI and the server share imports nothing of either",
    },
    Rule {
        krate: "coordinator",
        from: Modules::AllBut(&["provider"]),
        forbidden: CLOUD_SDKS,
        why: "only the providers name a cloud",
    },
];

/// A violation known today, to be removed by the restructure of issue 13.
enum Known {
    /// The members of one strongly connected component, in `scope` (the
    /// crate's top level `""`, or a folder module), sorted. None is known
    /// today; the variant stays so that one can be listed rather than hidden.
    #[allow(dead_code)]
    Cycle {
        krate: &'static str,
        scope: &'static str,
        members: &'static [&'static str],
        reason: &'static str,
    },
    /// Module `from` (a file's module path) names `to` against a rule.
    /// No layer break is known today; the variant stays so that one found
    /// while a module moves can be listed rather than hidden.
    #[allow(dead_code)]
    Layer {
        krate: &'static str,
        from: &'static str,
        to: &'static str,
        reason: &'static str,
    },
}

/// Today's violations (issue 13 restructures the coordinator and the agent
/// to remove them). Each entry must still be present: when a restructure
/// removes one, delete its entry here.
const KNOWN_VIOLATIONS: &[Known] = &[
    // None left: issue 13 broke the last cycle (app, domain, leader,
    // reconcile) by moving the settings and the bundle's view of the
    // coordinator into the domain and the reconciler's state out of it.
];

// ======================================================================
// The check.
// ======================================================================

#[test]
fn dependency_rules_hold() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = BTreeMap::new();
    for krate in ["common", "planner", "agent", "coordinator"] {
        let tree = Tree::load(krate, &root.join(krate).join("src"));
        assert!(
            tree.modules.len() > 3,
            "{krate}: found only {:?} under {}; is the source tree where the test expects it?",
            tree.modules.keys().collect::<Vec<_>>(),
            root.join(krate).join("src").display()
        );
        // A rule naming a module that moved would silently check nothing.
        for rule in RULES.iter().filter(|r| r.krate == krate) {
            let (Modules::Only(from) | Modules::AllBut(from)) = rule.from;
            let targets = rule.forbidden.iter().filter_map(|t| match t {
                Target::Module(m) => Some(*m),
                _ => None,
            });
            for m in from.iter().copied().chain(targets) {
                assert!(
                    tree.is_module(m),
                    "RULES names module {m:?} of {krate}, which does not exist (modules: {:?}); \
                     update RULES in tests/tests/layers.rs",
                    tree.modules
                        .keys()
                        .filter(|k| !k.is_empty())
                        .collect::<Vec<_>>()
                );
            }
        }
        for v in tree.violations(RULES) {
            found.insert(v.key.clone(), v);
        }
    }
    let known: BTreeMap<Key, &'static str> = KNOWN_VIOLATIONS
        .iter()
        .map(|k| match k {
            Known::Cycle {
                krate,
                scope,
                members,
                reason,
            } => (
                Key::Cycle {
                    krate: krate.to_string(),
                    scope: scope.to_string(),
                    members: members.iter().map(|m| m.to_string()).collect(),
                },
                *reason,
            ),
            Known::Layer {
                krate,
                from,
                to,
                reason,
            } => (
                Key::Layer {
                    krate: krate.to_string(),
                    from: from.to_string(),
                    to: to.to_string(),
                },
                *reason,
            ),
        })
        .collect();
    assert_eq!(
        known.len(),
        KNOWN_VIOLATIONS.len(),
        "KNOWN_VIOLATIONS lists a violation twice"
    );
    let mut report = String::new();
    for (key, v) in &found {
        if !known.contains_key(key) {
            report.push_str(&format!("new violation: {key}\n{}\n", v.evidence));
        }
    }
    for (key, reason) in &known {
        if !found.contains_key(key) {
            report.push_str(&format!(
                "listed in KNOWN_VIOLATIONS but no longer present ({reason}): {key}\n  \
                 remove it from KNOWN_VIOLATIONS in tests/tests/layers.rs (or list what replaced it)\n"
            ));
        }
    }
    assert!(
        report.is_empty(),
        "the dependency rule of ARCHITECTURE.md is broken:\n{report}"
    );
}

/// What identifies a violation in [`KNOWN_VIOLATIONS`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Cycle {
        krate: String,
        scope: String,
        members: Vec<String>,
    },
    Layer {
        krate: String,
        from: String,
        to: String,
    },
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Cycle {
                krate,
                scope,
                members,
            } => {
                let scope = if scope.is_empty() {
                    "top-level modules".to_string()
                } else {
                    format!("submodules of {scope}")
                };
                write!(
                    f,
                    "Known::Cycle {{ krate: {krate:?}, scope ({scope}), members: {members:?} }}"
                )
            }
            Key::Layer { krate, from, to } => write!(
                f,
                "Known::Layer {{ krate: {krate:?}, from: {from:?}, to: {to:?} }}"
            ),
        }
    }
}

struct Violation {
    key: Key,
    /// The cycle path or the rule, and the lines that make it.
    evidence: String,
}

// ======================================================================
// Source trees: modules, their files, what they name.
// ======================================================================

/// The crate root's module path.
const ROOT: &str = "";

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Dep {
    /// A module of the crate (`""` is the crate root's own items).
    Module(String),
    /// An external crate.
    Crate(String),
}

/// One dependency, where it is written.
#[derive(Debug, Clone)]
struct Edge {
    from: String,
    to: Dep,
    file: String,
    line: usize,
}

/// A crate's modules, by path (`"store"`, `"store/etcd"`; `""` the root).
struct Tree {
    krate: String,
    /// Module path -> its parsed files (`lib.rs` and `main.rs` for the root).
    modules: BTreeMap<String, Vec<Parsed>>,
    /// [`Tree::names`] of each module, once computed.
    names: RefCell<BTreeMap<String, Rc<BTreeMap<String, Named>>>>,
}

/// One source file after blanking comments, literals and test items.
struct Parsed {
    file: String,
    tokens: Vec<Tok>,
    /// The items the file defines at its top level.
    items: Vec<String>,
    /// `use` statements: whether `pub`, the paths, and their line.
    uses: Vec<UseStmt>,
    /// Modules declared `#[cfg(test)] mod x;` here, whose files are skipped.
    test_mods: BTreeSet<String>,
}

struct UseStmt {
    public: bool,
    line: usize,
    paths: Vec<UsePath>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct UsePath {
    segments: Vec<String>,
    /// `a::*`.
    glob: bool,
    /// The name it is imported as (`as x`, else the last segment).
    name: String,
}

impl Tree {
    fn load(krate: &str, src: &Path) -> Tree {
        let mut modules = BTreeMap::new();
        let mut roots = Vec::new();
        for f in ["lib.rs", "main.rs"] {
            let p = src.join(f);
            if p.exists() {
                roots.push(parse_file(&p, src));
            }
        }
        let skip: BTreeSet<String> = roots.iter().flat_map(|p| p.test_mods.clone()).collect();
        modules.insert(ROOT.to_string(), roots);
        load_children(src, src, ROOT, &skip, &mut modules);
        Tree {
            krate: krate.to_string(),
            modules,
            names: RefCell::default(),
        }
    }

    fn from_sources(krate: &str, files: &[(&str, &str)]) -> Tree {
        let mut modules: BTreeMap<String, Vec<Parsed>> = BTreeMap::new();
        for (path, text) in files {
            let module = module_of_file(path);
            modules
                .entry(module)
                .or_default()
                .push(parse_text(path, text));
        }
        Tree {
            krate: krate.to_string(),
            modules,
            names: RefCell::default(),
        }
    }

    fn is_module(&self, m: &str) -> bool {
        self.modules.contains_key(m)
    }

    /// What module `m`'s files make visible by name: child modules, items
    /// they define, and names they `use` (re-exports and private imports,
    /// which a child reaches through `super::`). Names that resolve outside
    /// the crate are left out.
    fn names(&self, m: &str, seen: &mut BTreeSet<String>) -> Rc<BTreeMap<String, Named>> {
        if let Some(done) = self.names.borrow().get(m) {
            return done.clone();
        }
        let outermost = seen.is_empty();
        let mut out = BTreeMap::new();
        if !seen.insert(m.to_string()) {
            return Rc::new(out);
        }
        for file in self.modules.get(m).into_iter().flatten() {
            for item in &file.items {
                out.insert(item.clone(), Named::Item(m.to_string()));
            }
        }
        for file in self.modules.get(m).into_iter().flatten() {
            for stmt in &file.uses {
                for p in &stmt.paths {
                    let Some(abs) = self.absolute(m, &p.segments) else {
                        continue;
                    };
                    if p.glob {
                        if let Some(Dep::Module(t)) = self.resolve_abs(&abs, seen) {
                            if abs.len() == depth(&t) {
                                for (name, named) in self.names(&t, seen).iter() {
                                    out.entry(name.clone()).or_insert(named.clone());
                                }
                            }
                        }
                    } else if let Some(Dep::Module(t)) = self.resolve_abs(&abs, seen) {
                        let named = if abs.len() == depth(&t) && self.is_module(&t) {
                            Named::Module(t)
                        } else {
                            Named::Item(t)
                        };
                        out.insert(p.name.clone(), named);
                    }
                }
            }
        }
        for child in self.children(m) {
            let name = child.rsplit('/').next().unwrap().to_string();
            out.insert(name, Named::Module(child));
        }
        seen.remove(m);
        let out = Rc::new(out);
        // A table computed inside another one's may miss names of a module
        // still being computed (a re-export cycle); only whole ones are kept.
        if outermost {
            self.names.borrow_mut().insert(m.to_string(), out.clone());
        }
        out
    }

    fn children(&self, m: &str) -> Vec<String> {
        self.modules
            .keys()
            .filter(|k| !k.is_empty() && parent(k) == m)
            .cloned()
            .collect()
    }

    /// Turns a path written in module `m` into segments from the crate
    /// root; `None` for a path into another crate.
    fn absolute(&self, m: &str, segments: &[String]) -> Option<Vec<String>> {
        let mut base: Vec<String> = split(m);
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let child = join(m, first);
                // A bare path names a child module of this one (in the crate
                // root, a top-level module), or something of another crate.
                if !self.is_module(&child) {
                    return None;
                }
            }
            None => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module an absolute path lands in, following re-exports.
    fn resolve_abs(&self, abs: &[String], seen: &mut BTreeSet<String>) -> Option<Dep> {
        let mut current = ROOT.to_string();
        for seg in abs {
            if seg == "self" {
                continue;
            }
            let child = join(&current, seg);
            if self.is_module(&child) {
                current = child;
                continue;
            }
            match self.names(&current, seen).get(seg) {
                Some(Named::Module(t)) => current = t.clone(),
                Some(Named::Item(t)) => return Some(Dep::Module(t.clone())),
                None => break,
            }
        }
        Some(Dep::Module(current))
    }

    /// Every dependency written in the crate's (non-test) code.
    fn edges(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        for (m, files) in &self.modules {
            for file in files {
                let mut seen = BTreeSet::new();
                // `pub use` in the crate root only re-exports: it makes no
                // dependency of the root's own code.
                for stmt in &file.uses {
                    if m.is_empty() && stmt.public {
                        continue;
                    }
                    for p in &stmt.paths {
                        self.push_edge(&mut edges, m, &p.segments, file, stmt.line, &mut seen);
                    }
                }
                for (segments, line) in paths(&file.tokens) {
                    self.push_edge(&mut edges, m, &segments, file, line, &mut seen);
                }
            }
        }
        edges
    }

    #[allow(clippy::too_many_arguments)]
    fn push_edge(
        &self,
        edges: &mut Vec<Edge>,
        m: &str,
        segments: &[String],
        file: &Parsed,
        line: usize,
        seen: &mut BTreeSet<String>,
    ) {
        let to = match self.absolute(m, segments) {
            Some(abs) => match self.resolve_abs(&abs, seen) {
                Some(dep) => dep,
                None => return,
            },
            None => match segments.first() {
                Some(first) if !matches!(first.as_str(), "crate" | "self" | "super") => {
                    Dep::Crate(first.clone())
                }
                _ => return,
            },
        };
        if to == Dep::Module(m.to_string()) {
            return;
        }
        edges.push(Edge {
            from: m.to_string(),
            to,
            file: file.file.clone(),
            line,
        });
    }

    fn violations(&self, rules: &[Rule]) -> Vec<Violation> {
        let edges = self.edges();
        let mut out = Vec::new();
        // Cycles: the top level, then the submodules of each folder module.
        let mut scopes: Vec<String> = vec![ROOT.to_string()];
        scopes.extend(
            self.modules
                .keys()
                .filter(|k| !k.is_empty() && !self.children(k).is_empty())
                .cloned(),
        );
        for scope in scopes {
            let mut graph: BTreeMap<String, BTreeMap<String, Vec<&Edge>>> = BTreeMap::new();
            for e in &edges {
                let Dep::Module(to) = &e.to else { continue };
                let (Some(a), Some(b)) = (node_in(&scope, &e.from), node_in(&scope, to)) else {
                    continue;
                };
                if a != b {
                    graph.entry(a).or_default().entry(b).or_default().push(e);
                }
            }
            for comp in strongly_connected(&graph) {
                let path = cycle_path(&graph, &comp);
                let mut evidence = format!(
                    "  {}: cycle {}\n",
                    self.krate,
                    path.iter()
                        .map(|n| display_node(n))
                        .collect::<Vec<_>>()
                        .join(" -> ")
                );
                for w in path.windows(2) {
                    let lines: BTreeSet<(&str, usize)> = graph[&w[0]][&w[1]]
                        .iter()
                        .map(|e| (e.file.as_str(), e.line))
                        .collect();
                    for (file, line) in lines.into_iter().take(3) {
                        evidence.push_str(&format!(
                            "    {} -> {}: {}:{}\n",
                            display_node(&w[0]),
                            display_node(&w[1]),
                            file,
                            line
                        ));
                    }
                }
                out.push(Violation {
                    key: Key::Cycle {
                        krate: self.krate.clone(),
                        scope: scope.clone(),
                        members: comp.iter().map(|n| display_node(n)).collect(),
                    },
                    evidence,
                });
            }
        }
        // Layer rules.
        let mut layer: BTreeMap<Key, Vec<String>> = BTreeMap::new();
        for rule in rules.iter().filter(|r| r.krate == self.krate) {
            for e in &edges {
                if !covers(rule.from, &e.from) {
                    continue;
                }
                for t in rule.forbidden {
                    let hit = match (t, &e.to) {
                        (Target::Module(f), Dep::Module(to)) => within(to, f),
                        (Target::AnyModule, Dep::Module(to)) => {
                            !to.is_empty() && !within(to, top(&e.from))
                        }
                        (Target::Crate(c), Dep::Crate(to)) => c == to,
                        _ => false,
                    };
                    if hit {
                        let to = match (t, &e.to) {
                            (Target::AnyModule, Dep::Module(to)) => top(to).to_string(),
                            (Target::Module(f), _) | (Target::Crate(f), _) => f.to_string(),
                            _ => unreachable!(),
                        };
                        let key = Key::Layer {
                            krate: self.krate.clone(),
                            from: e.from.clone(),
                            to,
                        };
                        let lines = layer.entry(key).or_default();
                        if lines.is_empty() {
                            lines.push(format!(
                                "  rule: {} must not name {t}: {}",
                                describe(rule.from),
                                rule.why
                            ));
                        }
                        let at = format!("    {}:{}", e.file, e.line);
                        if !lines.contains(&at) {
                            lines.push(at);
                        }
                    }
                }
            }
        }
        for (key, lines) in layer {
            out.push(Violation {
                key,
                evidence: lines.join("\n") + "\n",
            });
        }
        out
    }
}

/// Errors carry their context in types (`thiserror` enums), so that a
/// caller can match on them and every layer adds its own context: no
/// `Result<_, String>` outside test code, in any crate.
#[test]
fn no_string_errors_outside_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for krate in ["common", "planner", "agent", "coordinator"] {
        let tree = Tree::load(krate, &root.join(krate).join("src"));
        for file in tree.modules.values().flatten() {
            for line in string_error_results(&file.tokens) {
                found.push(format!("    {}:{line}", file.file));
            }
        }
    }
    assert!(
        found.is_empty(),
        "Result<_, String> outside test code; return a thiserror enum that names what failed:\n{}",
        found.join("\n")
    );
}

/// The crates `drover-planner` may depend on, and why each does no IO.
/// The planner does no IO (ARCHITECTURE.md): it is a function of the
/// cluster, its machines and what the coordinator observed. Its source
/// could not reach a socket, a file or a clock of its own without a crate
/// for it, so Cargo keeps it pure as long as its manifest names only these.
const PLANNER_DEPENDENCIES: &[(&str, &str)] = &[
    (
        "drover-common",
        "the objects it plans over; without features, as `tcp-proxy` brings tokio",
    ),
    (
        "time",
        "arithmetic on the `now` the coordinator hands it; the planner reads no clock",
    ),
    (
        "serde_json",
        "optional, for the `fixtures` feature only: the tests' objects are written as JSON",
    ),
];

#[test]
fn the_planner_depends_on_no_io_crate() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../planner/Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", manifest.display()));
    let deps = manifest_dependencies(&text);
    assert!(
        deps.iter().any(|d| d.name == "drover-common"),
        "no dependency found in {}: is the manifest where the test expects it? {deps:?}",
        manifest.display()
    );
    let mut wrong = vec![];
    for d in &deps {
        if !PLANNER_DEPENDENCIES.iter().any(|(name, _)| *name == d.name) {
            wrong.push(format!(
                "    line {}: {} (in [{}])",
                d.line, d.name, d.section
            ));
        } else if d.name == "drover-common" && d.spec.contains("features") {
            wrong.push(format!(
                "    line {}: drover-common with features ({}); its `tcp-proxy` brings tokio",
                d.line, d.spec
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "planner/Cargo.toml names a dependency outside the planner's allow-list. \
         The planner does no IO, and Cargo keeps it so only while its manifest \
         names no crate that does (tokio, the store, a cloud SDK, an HTTP client): \
         keep the IO in the coordinator and hand the planner what it read \
         (`Observed`), or, for a purely computational crate, add it with the \
         reason to PLANNER_DEPENDENCIES in tests/tests/layers.rs.\n{}\nallowed: {:?}",
        wrong.join("\n"),
        PLANNER_DEPENDENCIES
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
    );
}

/// One dependency a manifest names outside `[dev-dependencies]`.
#[derive(Debug)]
struct ManifestDependency {
    name: String,
    /// What follows the name on its line (`{ workspace = true, ... }`).
    spec: String,
    section: String,
    line: usize,
}

/// The dependencies of a Cargo manifest that build into the crate:
/// `[dependencies]`, `[build-dependencies]`, their `[target.….…]` forms and
/// `[dependencies.name]` tables; dev-dependencies only build its tests.
fn manifest_dependencies(text: &str) -> Vec<ManifestDependency> {
    let mut out = vec![];
    let mut section = String::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_end_matches(']').trim().to_string();
            // `[dependencies.name]`, `[target.'cfg(unix)'.dependencies.name]`.
            for kind in ["dependencies.", "build-dependencies."] {
                if let Some(at) = section.find(kind) {
                    let before = &section[..at];
                    // (`dev-dependencies.` leaves `dev-` before it: skipped.)
                    if before.is_empty() || before.ends_with('.') {
                        out.push(ManifestDependency {
                            name: section[at + kind.len()..].trim_matches('"').to_string(),
                            spec: String::new(),
                            section: section.clone(),
                            line: i + 1,
                        });
                    }
                }
            }
            continue;
        }
        let builds_in = section == "dependencies"
            || section == "build-dependencies"
            || (section.starts_with("target.")
                && (section.ends_with(".dependencies")
                    || section.ends_with(".build-dependencies")));
        if !builds_in {
            continue;
        }
        let Some((key, spec)) = line.split_once('=') else {
            continue;
        };
        // `name = ...`, `name.workspace = true`, `"name" = ...`.
        let name = key
            .split('.')
            .next()
            .unwrap_or_default()
            .trim()
            .trim_matches('"');
        out.push(ManifestDependency {
            name: name.to_string(),
            spec: format!("{}={}", &key[name.len().min(key.len())..], spec)
                .trim()
                .to_string(),
            section: section.clone(),
            line: i + 1,
        });
    }
    out
}

#[test]
fn manifest_dependencies_are_read_in_every_form_but_dev() {
    let deps = manifest_dependencies(
        r#"[package]
name = "demo"

[dependencies]
drover-common.workspace = true # the objects
time = { workspace = true }
"quoted" = "1"

[dependencies.tokio]
workspace = true

[target.'cfg(unix)'.dependencies]
nix = "0.30"

[build-dependencies]
cc = "1"

[dev-dependencies]
tempfile.workspace = true

[dev-dependencies.serde_json]
workspace = true
"#,
    );
    let names: Vec<(&str, &str)> = deps
        .iter()
        .map(|d| (d.name.as_str(), d.section.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("drover-common", "dependencies"),
            ("time", "dependencies"),
            ("quoted", "dependencies"),
            ("tokio", "dependencies.tokio"),
            ("nix", "target.'cfg(unix)'.dependencies"),
            ("cc", "build-dependencies"),
        ]
    );
    assert_eq!(deps[1].spec, "= { workspace = true }");
    assert_eq!(deps[0].line, 5);
}

/// The lines of `Result<…, String>` types: the last type argument of a
/// `Result` is the bare `String`.
fn string_error_results(tokens: &[Tok]) -> Vec<usize> {
    let punct = |t: Option<&Tok>, c: char| t.is_some_and(|t| t.kind == TokKind::Punct(c));
    let mut out = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if ident(Some(t)) != Some("Result") || !punct(tokens.get(i + 1), '<') {
            continue;
        }
        let mut depth = 0usize;
        // Where the last two type arguments start (a trailing comma makes
        // the last one empty).
        let mut arg_starts = vec![i + 2];
        let mut j = i + 1;
        while j < tokens.len() {
            match &tokens[j].kind {
                // `->` inside `Fn(..) -> T` is no closing bracket.
                TokKind::Punct('-') if punct(tokens.get(j + 1), '>') => j += 1,
                TokKind::Punct('<') => depth += 1,
                TokKind::Punct(',') if depth == 1 => arg_starts.push(j + 1),
                TokKind::Punct('>') => {
                    depth -= 1;
                    if depth == 0 {
                        let mut ends = arg_starts.iter().skip(1).map(|s| s - 1).chain([j]);
                        let args: Vec<&[Tok]> = arg_starts
                            .iter()
                            .map(|&start| &tokens[start..ends.next().unwrap_or(j)])
                            .filter(|a| !a.is_empty())
                            .collect();
                        if args.len() == 2
                            && args[1].len() == 1
                            && ident(args[1].first()) == Some("String")
                        {
                            out.push(t.line);
                        }
                        break;
                    }
                }
                TokKind::Punct(';' | '{') => break,
                _ => {}
            }
            j += 1;
        }
    }
    out
}

#[test]
fn string_error_results_are_found_over_lines_and_nested_types() {
    let tree = Tree::from_sources(
        "demo",
        &[(
            "src/lib.rs",
            "fn a() -> Result<Option<Vec<u8>>, String> { todo() }\n\
             fn b() -> Result<\n    u8,\n    String,\n> { todo() }\n\
             fn c() -> Result<String, Error> { todo() }\n\
             fn d(f: impl Fn() -> u8) -> std::io::Result<String> { todo() }\n\
             #[cfg(test)]\nmod tests { fn e() -> Result<(), String> { todo() } }\n",
        )],
    );
    let lines: Vec<usize> = tree
        .modules
        .values()
        .flatten()
        .flat_map(|f| string_error_results(&f.tokens))
        .collect();
    assert_eq!(lines, vec![1, 2]);
}

#[derive(Clone)]
enum Named {
    Module(String),
    Item(String),
}

fn load_children(
    src: &Path,
    dir: &Path,
    parent_module: &str,
    skip: &BTreeSet<String>,
    modules: &mut BTreeMap<String, Vec<Parsed>>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if skip.contains(&name) {
            continue;
        }
        if parent_module.is_empty() && (name == "lib" || name == "main" || name == "bin") {
            continue;
        }
        if name == "mod" {
            continue;
        }
        let module = join(parent_module, &name);
        if p.is_dir() {
            let file = p.join("mod.rs");
            let sibling = p.with_extension("rs");
            let mut files = Vec::new();
            if file.exists() {
                files.push(parse_file(&file, src));
            } else if !sibling.exists() {
                // A folder without its module file is not a module.
                continue;
            }
            let skip: BTreeSet<String> = files
                .iter()
                .flat_map(|f: &Parsed| f.test_mods.clone())
                .collect();
            modules.entry(module.clone()).or_default().extend(files);
            let mut skip = skip;
            if sibling.exists() {
                let parsed = parse_file(&sibling, src);
                skip.extend(parsed.test_mods.clone());
            }
            load_children(src, &p, &module, &skip, modules);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let parsed = parse_file(&p, src);
            modules.entry(module).or_default().push(parsed);
        }
    }
}

fn parse_file(p: &Path, src: &Path) -> Parsed {
    let text =
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    let krate_dir = src.parent().unwrap();
    let shown = p
        .strip_prefix(krate_dir.parent().unwrap_or(krate_dir))
        .unwrap_or(p)
        .display()
        .to_string();
    parse_text(&shown, &text)
}

/// `src/a/b.rs` and `src/a/b/mod.rs` -> `a/b`; `src/lib.rs` -> ``.
fn module_of_file(path: &str) -> String {
    let rel = path.split_once("src/").map_or(path, |(_, r)| r);
    let rel = rel.trim_end_matches(".rs");
    let rel = rel.trim_end_matches("/mod");
    if rel == "lib" || rel == "main" || rel == "mod" {
        String::new()
    } else {
        rel.to_string()
    }
}

fn split(m: &str) -> Vec<String> {
    if m.is_empty() {
        Vec::new()
    } else {
        m.split('/').map(str::to_string).collect()
    }
}

fn join(m: &str, name: &str) -> String {
    if m.is_empty() {
        name.to_string()
    } else {
        format!("{m}/{name}")
    }
}

fn parent(m: &str) -> &str {
    m.rsplit_once('/').map_or("", |(p, _)| p)
}

fn depth(m: &str) -> usize {
    split(m).len()
}

fn top(m: &str) -> &str {
    m.split('/').next().unwrap_or("")
}

/// Whether module `m` is `scope` or inside it.
fn within(m: &str, scope: &str) -> bool {
    m == scope || m.starts_with(&format!("{scope}/"))
}

fn covers(modules: Modules, m: &str) -> bool {
    match modules {
        Modules::Only(list) => list.iter().any(|s| within(m, s)),
        Modules::AllBut(list) => !m.is_empty() && !list.iter().any(|s| within(m, s)),
    }
}

fn describe(modules: Modules) -> String {
    match modules {
        Modules::Only(list) => format!("modules {}", list.join(", ")),
        Modules::AllBut(list) => format!("every module but {}", list.join(", ")),
    }
}

/// The node module `m` is in the graph of `scope`: at the top level, its
/// top-level module (or the root); inside a folder module, its child of it.
fn node_in(scope: &str, m: &str) -> Option<String> {
    if scope.is_empty() {
        return Some(top(m).to_string());
    }
    let rest = m.strip_prefix(&format!("{scope}/"))?;
    Some(join(scope, rest.split('/').next().unwrap()))
}

fn display_node(n: &str) -> String {
    if n.is_empty() {
        "(root)".to_string()
    } else {
        n.to_string()
    }
}

// ======================================================================
// Graphs.
// ======================================================================

type Graph<'a> = BTreeMap<String, BTreeMap<String, Vec<&'a Edge>>>;

/// The strongly connected components with more than one node (Tarjan).
fn strongly_connected(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g, 'a> {
        graph: &'g Graph<'a>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit(s: &mut State, v: &str) {
        s.index.insert(v.to_string(), s.next);
        s.low.insert(v.to_string(), s.next);
        s.next += 1;
        s.stack.push(v.to_string());
        s.on_stack.insert(v.to_string());
        let targets: Vec<String> = s
            .graph
            .get(v)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        for w in targets {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: BTreeSet<String> = graph
        .iter()
        .flat_map(|(a, t)| std::iter::once(a.clone()).chain(t.keys().cloned()))
        .collect();
    for n in nodes {
        if !s.index.contains_key(&n) {
            visit(&mut s, &n);
        }
    }
    s.out.sort();
    s.out
}

/// A shortest cycle through the first member of a component, as a path
/// that starts and ends with it.
fn cycle_path(graph: &Graph, comp: &[String]) -> Vec<String> {
    let members: BTreeSet<&String> = comp.iter().collect();
    let start = &comp[0];
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([start.clone()]);
    while let Some(v) = queue.pop_front() {
        for w in graph.get(&v).into_iter().flat_map(|t| t.keys()) {
            if !members.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![start.clone()];
                let mut at = v.clone();
                while at != *start {
                    path.push(at.clone());
                    at = prev[&at].clone();
                }
                path.push(start.clone());
                path.reverse();
                return path;
            }
            if !prev.contains_key(w) {
                prev.insert(w.clone(), v.clone());
                queue.push_back(w.clone());
            }
        }
    }
    unreachable!("a strongly connected component has a cycle through each member")
}

// ======================================================================
// Source text.
// ======================================================================

/// Comments, string and character literals blanked to spaces (line breaks
/// kept, so line numbers stay right).
fn blank_comments_and_literals(text: &str) -> Vec<char> {
    let c: Vec<char> = text.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in out.iter_mut().take(to).skip(from) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let end = c[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(c.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            let mut j = i;
            while j < c.len() {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (c[i] == 'r' || (c[i] == 'b' && c.get(i + 1) == Some(&'r')))
            && (i == 0 || !ident(c[i - 1]))
            && {
                let k = if c[i] == 'b' { i + 2 } else { i + 1 };
                let hashes = c[k..].iter().take_while(|&&x| x == '#').count();
                c.get(k + hashes) == Some(&'"')
            }
        {
            let k = if c[i] == 'b' { i + 2 } else { i + 1 };
            let hashes = c[k..].iter().take_while(|&&x| x == '#').count();
            let body = k + hashes + 1;
            let mut j = body;
            while j < c.len() {
                if c[j] == '"'
                    && c[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&x| x == '#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                if c[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{1F600}'), not a lifetime.
            if c.get(i + 1) == Some(&'\\') {
                let end = c[i + 2..]
                    .iter()
                    .position(|&x| x == '\'')
                    .map_or(c.len(), |p| i + 2 + p);
                blank(&mut out, i, end + 1);
                i = end + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                blank(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Blanks every item under `#[cfg(test)]` (a `mod tests { … }` block, a
/// `use`, a function) and returns the names of `#[cfg(test)] mod x;`.
fn blank_test_items(c: &mut [char]) -> BTreeSet<String> {
    let attr: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut test_mods = BTreeSet::new();
    let mut i = 0;
    while i + attr.len() <= c.len() {
        if c[i..i + attr.len()] != attr[..] {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = i + attr.len();
        // Further attributes of the same item.
        loop {
            while j < c.len() && c[j].is_whitespace() {
                j += 1;
            }
            if c.get(j) == Some(&'#') {
                let mut depth = 0;
                while j < c.len() {
                    match c[j] {
                        '[' => depth += 1,
                        ']' => {
                            depth -= 1;
                            if depth == 0 {
                                j += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
            } else {
                break;
            }
        }
        let item_start = j;
        let mut depth = 0i32;
        while j < c.len() {
            match c[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => {
                    let item: String = c[item_start..j].iter().collect();
                    let words: Vec<&str> = item.split_whitespace().collect();
                    if let Some(pos) = words.iter().position(|w| *w == "mod") {
                        if let Some(name) = words.get(pos + 1) {
                            test_mods.insert(name.to_string());
                        }
                    }
                    j += 1;
                    break;
                }
                '{' if depth == 0 => {
                    let mut braces = 0;
                    while j < c.len() {
                        match c[j] {
                            '{' => braces += 1,
                            '}' => {
                                braces -= 1;
                                if braces == 0 {
                                    j += 1;
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let end = j.min(c.len());
        for ch in c.iter_mut().take(end).skip(start) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = j;
    }
    test_mods
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TokKind {
    Ident(String),
    PathSep,
    Punct(char),
}

#[derive(Debug, Clone)]
struct Tok {
    kind: TokKind,
    line: usize,
}

fn tokenize(c: &[char]) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == 'r'
            && c.get(i + 1) == Some(&'#')
            && c.get(i + 2).is_some_and(|x| x.is_alphabetic() || *x == '_')
        {
            // A raw identifier, r#type.
            i += 2;
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok {
                kind: TokKind::Ident(c[start..i].iter().collect()),
                line,
            });
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok {
                kind: TokKind::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Tok {
                kind: TokKind::Punct(ch),
                line,
            });
            i += 1;
        }
    }
    out
}

fn parse_text(file: &str, text: &str) -> Parsed {
    let mut chars = blank_comments_and_literals(text);
    let test_mods = blank_test_items(&mut chars);
    let tokens = tokenize(&chars);
    let uses = use_statements(&tokens);
    let items = top_level_items(&tokens);
    Parsed {
        file: file.to_string(),
        tokens,
        items,
        uses,
        test_mods,
    }
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t.map(|t| &t.kind) {
        Some(TokKind::Ident(s)) => Some(s),
        _ => None,
    }
}

/// Every `use` statement, its tree flattened into paths.
fn use_statements(tokens: &[Tok]) -> Vec<UseStmt> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if ident(tokens.get(i)) != Some("use") || (i > 0 && tokens[i - 1].kind == TokKind::PathSep)
        {
            i += 1;
            continue;
        }
        // `pub use`, `pub(crate) use`, `pub(super) use`.
        let public = i > 0
            && (ident(tokens.get(i - 1)) == Some("pub")
                || (tokens[i - 1].kind == TokKind::Punct(')')
                    && tokens[..i - 1]
                        .iter()
                        .rev()
                        .take(4)
                        .any(|t| t.kind == TokKind::Ident("pub".into()))));
        let line = tokens[i].line;
        let mut j = i + 1;
        if tokens.get(j).map(|t| &t.kind) == Some(&TokKind::PathSep) {
            j += 1;
        }
        let mut paths = Vec::new();
        use_tree(tokens, &mut j, &[], &mut paths);
        while j < tokens.len() && tokens[j].kind != TokKind::Punct(';') {
            j += 1;
        }
        out.push(UseStmt {
            public,
            line,
            paths,
        });
        i = j + 1;
    }
    out
}

fn use_tree(tokens: &[Tok], j: &mut usize, prefix: &[String], out: &mut Vec<UsePath>) {
    let mut segments = prefix.to_vec();
    loop {
        match tokens.get(*j).map(|t| &t.kind) {
            Some(TokKind::Ident(s)) => {
                segments.push(s.clone());
                *j += 1;
                if tokens.get(*j).map(|t| &t.kind) == Some(&TokKind::PathSep) {
                    *j += 1;
                    continue;
                }
                let mut name = segments.last().cloned().unwrap_or_default();
                if ident(tokens.get(*j)) == Some("as") {
                    if let Some(alias) = ident(tokens.get(*j + 1)) {
                        name = alias.to_string();
                    }
                    *j += 2;
                }
                if name == "self" {
                    segments.pop();
                    name = segments.last().cloned().unwrap_or_default();
                }
                out.push(UsePath {
                    segments,
                    glob: false,
                    name,
                });
                return;
            }
            Some(TokKind::Punct('*')) => {
                *j += 1;
                out.push(UsePath {
                    segments,
                    glob: true,
                    name: String::new(),
                });
                return;
            }
            Some(TokKind::Punct('{')) => {
                *j += 1;
                loop {
                    match tokens.get(*j).map(|t| &t.kind) {
                        Some(TokKind::Punct('}')) => {
                            *j += 1;
                            return;
                        }
                        Some(TokKind::Punct(',')) => *j += 1,
                        None | Some(TokKind::Punct(';')) => return,
                        _ => {
                            let before = *j;
                            use_tree(tokens, j, &segments, out);
                            if *j == before {
                                *j += 1;
                            }
                        }
                    }
                }
            }
            _ => return,
        }
    }
}

/// Every path of two segments or more outside `use` statements
/// (`crate::a::b`, `super::x`, `tokio::spawn`), with its line; a path after
/// `::` or `.` is part of another and skipped.
fn paths(tokens: &[Tok]) -> Vec<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mut in_use = false;
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        if in_use {
            if t.kind == TokKind::Punct(';') {
                in_use = false;
            }
            i += 1;
            continue;
        }
        let Some(first) = ident(Some(t)) else {
            i += 1;
            continue;
        };
        let prev = i.checked_sub(1).map(|p| &tokens[p].kind);
        if first == "use" && prev != Some(&TokKind::PathSep) {
            in_use = true;
            i += 1;
            continue;
        }
        if matches!(prev, Some(TokKind::PathSep) | Some(TokKind::Punct('.'))) {
            i += 1;
            continue;
        }
        let mut segments = vec![first.to_string()];
        let mut j = i + 1;
        while tokens.get(j).map(|t| &t.kind) == Some(&TokKind::PathSep) {
            match ident(tokens.get(j + 1)) {
                Some(s) => {
                    segments.push(s.to_string());
                    j += 2;
                }
                None => break,
            }
        }
        if segments.len() > 1 {
            out.push((segments, t.line));
        }
        i = j.max(i + 1);
    }
    out
}

/// The names of the items a file defines at its top level (`struct`,
/// `enum`, `fn`, `const`, `static`, `trait`, `type`, `union`, `macro_rules!`).
fn top_level_items(tokens: &[Tok]) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    for (i, t) in tokens.iter().enumerate() {
        match &t.kind {
            TokKind::Punct('{') => depth += 1,
            TokKind::Punct('}') => depth -= 1,
            TokKind::Ident(k) if depth == 0 => {
                let keyword = matches!(
                    k.as_str(),
                    "struct" | "enum" | "fn" | "const" | "static" | "trait" | "type" | "union"
                );
                if keyword && (i == 0 || tokens[i - 1].kind != TokKind::PathSep) {
                    if let Some(name) = ident(tokens.get(i + 1)) {
                        if name != "fn" && name != "mut" {
                            out.push(name.to_string());
                        } else if let Some(name) = ident(tokens.get(i + 2)) {
                            out.push(name.to_string());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

// ======================================================================
// The parser's own tests, on small inline sources.
// ======================================================================

fn edges_of(tree: &Tree) -> BTreeSet<(String, String)> {
    tree.edges()
        .into_iter()
        .filter_map(|e| match e.to {
            Dep::Module(to) => Some((e.from, to)),
            Dep::Crate(_) => None,
        })
        .collect()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[test]
fn parser_finds_a_cycle_with_its_path() {
    let tree = Tree::from_sources(
        "demo",
        &[
            ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
            ("src/a.rs", "pub fn f() { crate::b::g() }\n"),
            ("src/b.rs", "use crate::c::h;\npub fn g() { h() }\n"),
            ("src/c.rs", "pub fn h() {\n    super::a::f();\n}\n"),
        ],
    );
    assert_eq!(
        edges_of(&tree),
        [pair("a", "b"), pair("b", "c"), pair("c", "a")].into()
    );
    let v = tree.violations(&[]);
    assert_eq!(v.len(), 1);
    assert_eq!(
        v[0].key,
        Key::Cycle {
            krate: "demo".into(),
            scope: String::new(),
            members: vec!["a".into(), "b".into(), "c".into()],
        }
    );
    assert!(
        v[0].evidence.contains("cycle a -> b -> c -> a"),
        "{}",
        v[0].evidence
    );
    assert!(
        v[0].evidence.contains("c -> a: src/c.rs:2"),
        "{}",
        v[0].evidence
    );
}

#[test]
fn parser_reads_grouped_use_over_lines() {
    let tree = Tree::from_sources(
        "demo",
        &[
            ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n"),
            (
                "src/a.rs",
                "use crate::{\n    b::{self, X},\n    c::Y as Z, // d::W in a comment\n};\nfn f() -> &'static str { \"crate::d::V\" }\n",
            ),
            ("src/b.rs", "pub struct X;\n"),
            ("src/c.rs", "pub struct Y;\n"),
            ("src/d.rs", "pub struct W;\n"),
        ],
    );
    assert_eq!(edges_of(&tree), [pair("a", "b"), pair("a", "c")].into());
    let a = &tree.modules["a"][0];
    assert_eq!(a.uses.len(), 1);
    let names: Vec<&str> = a.uses[0].paths.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["b", "X", "Z"]);
    assert_eq!(a.uses[0].line, 1);
}

#[test]
fn parser_ignores_test_blocks() {
    let tree = Tree::from_sources(
        "demo",
        &[
            ("src/lib.rs", "pub mod a;\npub mod b;\n"),
            ("src/a.rs", "pub fn f() { crate::b::g() }\n"),
            (
                "src/b.rs",
                "pub fn g() {}\n#[cfg(test)]\nmod tests {\n    use crate::a::f;\n    #[test]\n    fn t() { f(); let _ = '{'; }\n}\n#[cfg(test)]\nuse crate::a;\n",
            ),
        ],
    );
    assert_eq!(edges_of(&tree), [pair("a", "b")].into());
    assert!(tree.violations(&[]).is_empty());
}

#[test]
fn parser_follows_reexports_and_checks_rules() {
    let tree = Tree::from_sources(
        "demo",
        &[
            (
                "src/lib.rs",
                "pub mod objects;\npub mod wire;\npub use objects::meta as m;\n",
            ),
            ("src/objects/mod.rs", "pub mod meta;\npub use meta::*;\n"),
            (
                "src/objects/meta.rs",
                "pub struct Meta;\npub fn f() { crate::wire::Hello; }\n",
            ),
            (
                "src/wire/mod.rs",
                "use crate::objects::Meta;\npub struct Hello(Meta);\nfn g() { bollard::x(); }\n",
            ),
        ],
    );
    assert_eq!(
        edges_of(&tree),
        [
            // `pub use meta::*` in objects/mod.rs: a parent naming its child.
            pair("objects", "objects/meta"),
            pair("objects/meta", "wire"),
            pair("wire", "objects/meta"),
        ]
        .into()
    );
    const RULES: &[Rule] = &[
        Rule {
            krate: "demo",
            from: Modules::Only(&["objects"]),
            forbidden: &[Target::Module("wire")],
            why: "objects never use wire",
        },
        Rule {
            krate: "demo",
            from: Modules::AllBut(&["provider"]),
            forbidden: &[Target::Crate("bollard")],
            why: "only providers name a cloud",
        },
    ];
    let keys: Vec<Key> = tree.violations(RULES).into_iter().map(|v| v.key).collect();
    assert_eq!(
        keys,
        [
            Key::Cycle {
                krate: "demo".into(),
                scope: String::new(),
                members: vec!["objects".into(), "wire".into()],
            },
            Key::Layer {
                krate: "demo".into(),
                from: "objects/meta".into(),
                to: "wire".into(),
            },
            Key::Layer {
                krate: "demo".into(),
                from: "wire".into(),
                to: "bollard".into(),
            },
        ]
    );
}
