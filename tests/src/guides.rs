//! The operator's guides (`docs/*.md`) read as steps a lab test plays
//! against the guide world ([`crate::guide_world`]). The guides follow one
//! convention (docs/development.md, "Tests that read the guides"): a command
//! is a `sh` block; the `text` block right after it is its expected output,
//! line by line in order, `...` standing for any text within a line; a
//! manifest the user saves carries `<!-- file: NAME -->` before its fence;
//! a block that cannot run in the lab carries `<!-- not run: why -->`.
use std::fmt;

/// One step of a guide, in the order a reader meets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A heading (`#` to `######`), whose title places hooks.
    Heading(String),
    /// A manifest the user saves as `name`.
    File {
        /// The file name from `<!-- file: NAME -->`.
        name: String,
        /// Its content.
        text: String,
    },
    /// A shell block the user runs.
    Run(Block),
    /// A shell block marked `<!-- not run: why -->`.
    NotRun {
        /// The block.
        block: Block,
        /// Why it cannot run in the lab.
        why: String,
    },
}

/// A shell block and what the guide shows of its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The guide's line of the opening fence (1-based).
    pub line: usize,
    /// The commands.
    pub script: String,
    /// The expected output lines (empty when the guide shows none).
    pub expect: Vec<String>,
}

/// A guide: its name (`install.md`) and its steps.
#[derive(Debug, Clone)]
pub struct Guide {
    /// The file name under `docs/`.
    pub name: String,
    /// The steps in order.
    pub steps: Vec<Step>,
}

/// A fenced block as found: its info string, first line, content.
struct Fence {
    info: String,
    line: usize,
    text: String,
}

/// What precedes a fence that gives it a meaning.
enum Marker {
    File(String),
    NotRun(String),
}

fn marker(line: &str) -> Option<Marker> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim();
    if let Some(name) = inner.strip_prefix("file:") {
        return Some(Marker::File(name.trim().to_owned()));
    }
    inner
        .strip_prefix("not run:")
        .map(|why| Marker::NotRun(why.trim().to_owned()))
}

impl Guide {
    /// Reads guide `name` from its markdown `text`; an error names the line
    /// that breaks the convention.
    pub fn parse(name: &str, text: &str) -> Result<Self, String> {
        let lines: Vec<&str> = text.lines().collect();
        let mut steps = Vec::new();
        let mut pending: Option<(usize, Marker)> = None;
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            let at = |n: usize| format!("{name}:{}", n + 1);
            if let Some(info) = line.strip_prefix("```") {
                let start = i;
                let mut end = i + 1;
                while end < lines.len() && !lines[end].starts_with("```") {
                    end += 1;
                }
                if end == lines.len() {
                    return Err(format!("{}: a fence that never closes", at(start)));
                }
                let fence = Fence {
                    info: info.trim().to_owned(),
                    line: start + 1,
                    text: lines[start + 1..end].join("\n"),
                };
                i = end + 1;
                steps.extend(Self::step(name, fence, pending.take(), &lines, &mut i)?);
                continue;
            }
            if let Some(m) = marker(line) {
                if pending.is_some() {
                    return Err(format!("{}: two markers before one block", at(i)));
                }
                pending = Some((i, m));
            } else if let Some(title) = line.strip_prefix('#') {
                steps.push(Step::Heading(
                    title.trim_start_matches('#').trim().to_owned(),
                ));
            } else if !line.trim().is_empty() {
                if let Some((n, _)) = pending {
                    return Err(format!("{}: a marker not followed by its block", at(n)));
                }
            }
            i += 1;
        }
        if let Some((n, _)) = pending {
            return Err(format!("{name}:{}: a marker at the end", n + 1));
        }
        Ok(Self {
            name: name.to_owned(),
            steps,
        })
    }

    /// The step a fence makes; a `sh` block takes the `text` block right
    /// after it (blank lines between) as its expected output.
    fn step(
        name: &str,
        fence: Fence,
        marker: Option<(usize, Marker)>,
        lines: &[&str],
        next: &mut usize,
    ) -> Result<Option<Step>, String> {
        match (fence.info.as_str(), marker) {
            (_, Some((_, Marker::File(file)))) => Ok(Some(Step::File {
                name: file,
                text: fence.text + "\n",
            })),
            ("sh", marker) => {
                let mut j = *next;
                while j < lines.len() && lines[j].trim().is_empty() {
                    j += 1;
                }
                let mut expect = Vec::new();
                if j < lines.len() && lines[j].trim_end() == "```text" {
                    let mut end = j + 1;
                    while end < lines.len() && !lines[end].starts_with("```") {
                        expect.push(lines[end].to_owned());
                        end += 1;
                    }
                    *next = end + 1;
                }
                let block = Block {
                    line: fence.line,
                    script: fence.text,
                    expect,
                };
                Ok(Some(match marker {
                    Some((_, Marker::NotRun(why))) => Step::NotRun { block, why },
                    _ => Step::Run(block),
                }))
            }
            (_, Some((n, Marker::NotRun(_)))) => Err(format!(
                "{name}:{}: `not run` marks a {} block; only sh blocks run",
                n + 1,
                fence.info
            )),
            _ => Ok(None),
        }
    }

    /// The blocks that run.
    pub fn runs(&self) -> impl Iterator<Item = &Block> {
        self.steps.iter().filter_map(|s| match s {
            Step::Run(b) => Some(b),
            _ => None,
        })
    }

    /// The blocks marked not runnable, with why.
    pub fn not_runs(&self) -> impl Iterator<Item = (&Block, &str)> {
        self.steps.iter().filter_map(|s| match s {
            Step::NotRun { block, why } => Some((block, why.as_str())),
            _ => None,
        })
    }
}

/// Why an output does not show what the guide says.
#[derive(Debug)]
pub struct Mismatch {
    /// The first expected line not found (in order).
    pub missing: String,
    /// The output.
    pub output: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the output has no line like `{}` (in the guide's order); it was:\n{}",
            self.missing, self.output
        )
    }
}

/// Runs of blanks are one space, ends trimmed: `kubectl` pads its columns
/// to the widest value, which the guide's example cannot know.
fn squeezed(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `line` is like `pattern`, where `...` stands for any text.
pub fn like(pattern: &str, line: &str) -> bool {
    let (pattern, line) = (squeezed(pattern), squeezed(line));
    let parts: Vec<&str> = pattern.split("...").collect();
    let (first, rest) = parts.split_first().expect("split yields one part");
    let Some(mut tail) = line.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return tail.is_empty();
    };
    for part in middle {
        match tail.find(part) {
            Some(at) => tail = &tail[at + part.len()..],
            None => return false,
        }
    }
    tail.len() >= last.len() && tail.ends_with(last)
}

/// Checks that every expected line is like an output line, in order.
pub fn check_output(expect: &[String], output: &str) -> Result<(), Mismatch> {
    let mut lines = output.lines();
    for want in expect.iter().filter(|w| !w.trim().is_empty()) {
        if !lines.by_ref().any(|line| like(want, line)) {
            return Err(Mismatch {
                missing: want.clone(),
                output: output.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUIDE: &str = "# Title\n\nText.\n\n<!-- file: a.yaml -->\n```yaml\nkind: A\n```\n\n\
        ```sh\nkubectl apply -f a.yaml\n```\n\n```text\na...created\n```\n\n## Part\n\n\
        <!-- not run: needs a cloud -->\n```sh\ncloud up\n```\n\n```yaml\nnot: saved\n```\n";

    #[test]
    fn a_guide_reads_as_headings_files_runs_and_marked_blocks() {
        let g = Guide::parse("g.md", GUIDE).expect("valid");
        assert_eq!(
            g.steps,
            vec![
                Step::Heading("Title".into()),
                Step::File {
                    name: "a.yaml".into(),
                    text: "kind: A\n".into()
                },
                Step::Run(Block {
                    line: 10,
                    script: "kubectl apply -f a.yaml".into(),
                    expect: vec!["a...created".into()],
                }),
                Step::Heading("Part".into()),
                Step::NotRun {
                    block: Block {
                        line: 21,
                        script: "cloud up".into(),
                        expect: vec![]
                    },
                    why: "needs a cloud".into()
                },
            ]
        );
    }

    #[test]
    fn broken_conventions_are_named_with_their_line() {
        let e = Guide::parse("g.md", "<!-- file: a.yaml -->\nprose\n```yaml\n```\n")
            .expect_err("refused");
        assert_eq!(e, "g.md:1: a marker not followed by its block");
        let e = Guide::parse("g.md", "<!-- not run: x -->\n```yaml\n```\n").expect_err("refused");
        assert!(e.starts_with("g.md:1: `not run` marks a yaml block"), "{e}");
        let e = Guide::parse("g.md", "```sh\nls\n").expect_err("refused");
        assert_eq!(e, "g.md:1: a fence that never closes");
    }

    #[test]
    fn expected_lines_match_in_order_with_wildcards_and_any_padding() {
        let out =
            "NAME          STATUS   VOLUME\ndata-test     Bound    pvc-1\nvolsize\t1073741824\n";
        assert!(like("data-test...Bound...", "data-test     Bound    pvc-1"));
        assert!(like("volsize...", "volsize\t1073741824"));
        assert!(!like("volsize", "volsize\t1073741824"));
        assert!(!like("a...b...b", "a b"));
        assert!(check_output(&["data-test Bound...".into(), "volsize...".into()], out).is_ok());
        let e =
            check_output(&["volsize...".into(), "data-test...".into()], out).expect_err("refused");
        assert_eq!(e.missing, "data-test...");
    }

    #[test]
    fn every_guide_follows_the_convention() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs");
        let mut runs = 0;
        for entry in std::fs::read_dir(dir).expect("docs/ reads") {
            let path = entry.expect("a docs entry").path();
            let text = std::fs::read_to_string(&path).expect("a guide reads");
            let name = path
                .file_name()
                .expect("a file name")
                .to_string_lossy()
                .into_owned();
            let guide = Guide::parse(&name, &text).unwrap_or_else(|e| panic!("{e}"));
            runs += guide.runs().count();
            for (block, why) in guide.not_runs() {
                assert!(
                    !why.is_empty(),
                    "{name}:{}: not run without a reason",
                    block.line
                );
            }
        }
        assert!(runs > 50, "the guides hold {runs} runnable blocks");
    }
}
