//! The two Dockerfiles describe one image: the root `Dockerfile` (`docker build .`, where a
//! container registry answers; the release workflow's image) and `docker/Dockerfile`
//! (`scripts/build-image`, from a binary compiled on the machine, no registry). Their final
//! stages must give the same image to whoever runs it: base, user, exposed ports, volumes,
//! entrypoint, command, environment, stop signal, working directory and the paths copied in
//! (with their owners). How each stage gets its files (a builder stage or the build context) is
//! theirs to differ on.
//!
//! The reader below knows only the Dockerfile syntax these two files use (instructions, `\`
//! continuations, `#` comments, exec-form JSON arrays, `KEY=value` pairs); it knows nothing of
//! Docker itself, and a file it cannot read fails the test saying which line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a final stage gives a container, in the order a reader compares it.
#[derive(Debug, Default, PartialEq, Eq)]
struct FinalImage {
    /// The final `FROM`'s image (its `AS` name left out).
    base: String,
    user: Option<String>,
    exposed: Vec<String>,
    volumes: Vec<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: BTreeMap<String, String>,
    stop_signal: Option<String>,
    workdir: Option<String>,
    /// Each `COPY`/`ADD`: (destination, `--chown`, the sources' last path components).
    copies: Vec<(String, Option<String>, Vec<String>)>,
}

/// Joins `\` continuations and drops comments and blank lines: one logical instruction per item,
/// with the line number it starts on.
fn instructions(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_none()) {
            continue;
        }
        let (body, continues) = match line.strip_suffix('\\') {
            Some(body) => (body.trim_end(), true),
            None => (line, false),
        };
        let entry = pending.get_or_insert_with(|| (index + 1, String::new()));
        if !entry.1.is_empty() && !body.is_empty() {
            entry.1.push(' ');
        }
        entry.1.push_str(body);
        if !continues {
            out.extend(pending.take());
        }
    }
    out.extend(pending);
    out
}

/// An exec-form JSON array (`["/sqlhttpd"]`), or a shell-form line as `/bin/sh -c` would get it.
fn exec_form(args: &str) -> Vec<String> {
    if args.starts_with('[')
        && let Ok(list) = serde_json::from_str::<Vec<String>>(args)
    {
        return list;
    }
    vec!["/bin/sh".into(), "-c".into(), args.into()]
}

/// Splits on whitespace, keeping double-quoted stretches whole (quotes removed).
fn words(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in args.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

/// The final stage of a Dockerfile's text, or the first line it cannot read.
fn final_image(text: &str) -> Result<FinalImage, String> {
    let all = instructions(text);
    let start = all
        .iter()
        .rposition(|(_, line)| {
            line.split_whitespace()
                .next()
                .is_some_and(|i| i.eq_ignore_ascii_case("FROM"))
        })
        .ok_or("no FROM instruction")?;
    let mut image = FinalImage::default();
    for (number, line) in &all[start..] {
        let (instruction, args) = line
            .split_once(char::is_whitespace)
            .unwrap_or((line.as_str(), ""));
        let args = args.trim();
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => {
                let from: Vec<&str> = args
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                image.base = from
                    .first()
                    .ok_or(format!("line {number}: FROM without an image"))?
                    .to_string();
            }
            "USER" => image.user = Some(args.to_string()),
            "EXPOSE" => image.exposed.extend(args.split_whitespace().map(|port| {
                if port.contains('/') {
                    port.to_string()
                } else {
                    format!("{port}/tcp")
                }
            })),
            "VOLUME" => image.volumes.extend(if args.starts_with('[') {
                serde_json::from_str::<Vec<String>>(args)
                    .map_err(|e| format!("line {number}: VOLUME: {e}"))?
            } else {
                words(args)
            }),
            "ENTRYPOINT" => image.entrypoint = Some(exec_form(args)),
            "CMD" => image.cmd = Some(exec_form(args)),
            "ENV" => {
                for pair in words(args) {
                    let (key, value) = pair
                        .split_once('=')
                        .ok_or(format!("line {number}: ENV {pair:?} is not KEY=value"))?;
                    image.env.insert(key.to_string(), value.to_string());
                }
            }
            "STOPSIGNAL" => image.stop_signal = Some(args.to_string()),
            "WORKDIR" => image.workdir = Some(args.to_string()),
            "COPY" | "ADD" => {
                let mut chown = None;
                let mut paths = Vec::new();
                for word in words(args) {
                    match word.strip_prefix("--") {
                        Some(flag) => {
                            if let Some(owner) = flag.strip_prefix("chown=") {
                                chown = Some(owner.to_string());
                            }
                        }
                        None => paths.push(word),
                    }
                }
                let destination = paths.pop().ok_or(format!(
                    "line {number}: {instruction} without a destination"
                ))?;
                if paths.is_empty() {
                    return Err(format!("line {number}: {instruction} without a source"));
                }
                let sources = paths
                    .iter()
                    .map(|source| {
                        source
                            .trim_end_matches('/')
                            .rsplit('/')
                            .next()
                            .unwrap_or_default()
                            .to_string()
                    })
                    .collect();
                image.copies.push((destination, chown, sources));
            }
            // What only builds (ARG, LABEL, SHELL, RUN in a stage of its own) is not compared;
            // a RUN in the final stage would be a file the other stage lacks.
            "ARG" | "LABEL" => {}
            "ONBUILD" | "HEALTHCHECK" | "RUN" | "SHELL" => {
                return Err(format!(
                    "line {number}: {instruction} in the final stage is not compared here: compare it, or move it"
                ));
            }
            other => return Err(format!("line {number}: unknown instruction {other}")),
        }
    }
    Ok(image)
}

/// Every difference between two final images, one line each, naming the field and both values.
fn differences(
    left_name: &str,
    left: &FinalImage,
    right_name: &str,
    right: &FinalImage,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut compare = |field: &str, a: String, b: String| {
        if a != b {
            out.push(format!(
                "{field}: {left_name} has {a}, {right_name} has {b}"
            ));
        }
    };
    compare(
        "base image (FROM)",
        format!("{:?}", left.base),
        format!("{:?}", right.base),
    );
    compare(
        "USER",
        format!("{:?}", left.user),
        format!("{:?}", right.user),
    );
    compare(
        "EXPOSE",
        format!("{:?}", left.exposed),
        format!("{:?}", right.exposed),
    );
    compare(
        "VOLUME",
        format!("{:?}", left.volumes),
        format!("{:?}", right.volumes),
    );
    compare(
        "ENTRYPOINT",
        format!("{:?}", left.entrypoint),
        format!("{:?}", right.entrypoint),
    );
    compare("CMD", format!("{:?}", left.cmd), format!("{:?}", right.cmd));
    compare("ENV", format!("{:?}", left.env), format!("{:?}", right.env));
    compare(
        "STOPSIGNAL",
        format!("{:?}", left.stop_signal),
        format!("{:?}", right.stop_signal),
    );
    compare(
        "WORKDIR",
        format!("{:?}", left.workdir),
        format!("{:?}", right.workdir),
    );
    compare(
        "files copied in (destination, owner, sources)",
        format!("{:?}", left.copies),
        format!("{:?}", right.copies),
    );
    out
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read_final_image(relative: &str) -> FinalImage {
    let path = repository().join(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    final_image(&text).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

#[test]
fn the_root_dockerfile_and_build_images_describe_the_same_final_image() {
    let root = read_final_image("Dockerfile");
    let local = read_final_image("docker/Dockerfile");
    let found = differences("Dockerfile", &root, "docker/Dockerfile", &local);
    assert!(
        found.is_empty(),
        "`docker build .` and scripts/build-image must give the same image; change both final stages:\n  {}",
        found.join("\n  ")
    );
    // And it is the image the documents promise: non-root, the one port, the data volume.
    assert_eq!(root.base, "scratch");
    assert_eq!(root.user.as_deref(), Some("10001:10001"));
    assert_eq!(root.exposed, ["8080/tcp"]);
    assert_eq!(root.volumes, ["/data"]);
    assert_eq!(root.entrypoint, Some(vec!["/sqlhttpd".to_string()]));
    assert_eq!(
        root.env.get("SQLHTTPD_LISTEN").map(String::as_str),
        Some("0.0.0.0:8080")
    );
}

const STAGE: &str = r#"
FROM rust:1.95 AS builder
USER root
RUN cargo build
FROM scratch AS final
# a comment
COPY --from=builder --chown=10001:10001 /out/data/ /data/
COPY --from=builder /out/sqlhttpd /sqlhttpd
ENV A=1 \
    B="two words"
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8080
ENTRYPOINT ["/sqlhttpd"]
"#;

#[test]
fn the_reader_takes_the_final_stage_only_and_reads_each_field() {
    let image = final_image(STAGE).unwrap();
    assert_eq!(image.base, "scratch");
    assert_eq!(
        image.user.as_deref(),
        Some("10001:10001"),
        "the builder's USER is not the image's"
    );
    assert_eq!(image.exposed, ["8080/tcp"]);
    assert_eq!(image.volumes, ["/data"]);
    assert_eq!(image.entrypoint, Some(vec!["/sqlhttpd".to_string()]));
    assert_eq!(image.cmd, None);
    assert_eq!(
        image.env,
        BTreeMap::from([
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "two words".to_string())
        ])
    );
    assert_eq!(
        image.copies,
        [
            (
                "/data/".to_string(),
                Some("10001:10001".to_string()),
                vec!["data".to_string()]
            ),
            ("/sqlhttpd".to_string(), None, vec!["sqlhttpd".to_string()]),
        ]
    );
}

#[test]
fn a_changed_field_is_named_with_both_values() {
    let base = final_image(STAGE).unwrap();
    for (from, to, field) in [
        ("USER 10001:10001", "USER 0", "USER"),
        ("EXPOSE 8080", "EXPOSE 8080 9090", "EXPOSE"),
        ("VOLUME [\"/data\"]", "VOLUME [\"/var/lib\"]", "VOLUME"),
        (
            "ENTRYPOINT [\"/sqlhttpd\"]",
            "ENTRYPOINT /sqlhttpd",
            "ENTRYPOINT",
        ),
        ("A=1", "A=2", "ENV"),
        (
            "COPY --from=builder /out/sqlhttpd /sqlhttpd",
            "COPY --from=builder /out/sqlhttpd /bin/sqlhttpd",
            "files copied",
        ),
        (
            "ENTRYPOINT [\"/sqlhttpd\"]",
            "ENTRYPOINT [\"/sqlhttpd\"]\nCMD [\"--help\"]",
            "CMD",
        ),
        (
            "ENTRYPOINT [\"/sqlhttpd\"]",
            "ENTRYPOINT [\"/sqlhttpd\"]\nSTOPSIGNAL SIGINT",
            "STOPSIGNAL",
        ),
    ] {
        let changed = final_image(&STAGE.replace(from, to)).unwrap();
        let found = differences("a", &base, "b", &changed);
        assert_eq!(found.len(), 1, "{from} -> {to}: {found:?}");
        assert!(found[0].starts_with(field), "{from} -> {to}: {found:?}");
    }
}

#[test]
fn what_the_reader_cannot_compare_fails_naming_the_line() {
    let error = final_image("FROM scratch\nRUN touch /x\n").unwrap_err();
    assert!(error.starts_with("line 2: RUN"), "{error}");
    let error = final_image("FROM scratch\nFROBNICATE\n").unwrap_err();
    assert_eq!(error, "line 2: unknown instruction FROBNICATE");
    let error = final_image("FROM scratch\nENV A\n").unwrap_err();
    assert!(error.contains("not KEY=value"), "{error}");
    assert_eq!(
        final_image("# nothing\n").unwrap_err(),
        "no FROM instruction"
    );
}
