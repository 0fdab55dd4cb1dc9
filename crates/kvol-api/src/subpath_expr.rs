//! A volumeMount's `subPath` and `subPathExpr` as the v1.26 kubelet takes them: `$(VAR)` expansion, the container's `subPathExpr` expanded, and the checks a sub-path must pass before anything is bound; pure.
//!
//! Facts from upstream:
//! - `third_party/forked/golang/expansion/expand.go` (the `$(VAR)` rules shared by `command`,
//!   `args`, `env` and `subPathExpr`): `$(NAME)` is replaced by the mapping's answer for `NAME`
//!   (the name is everything up to the first `)`, so `$(A$(B))` names `A$(B`); `$$` is one
//!   literal `$` (so `$$(VAR)` is the literal `$(VAR)`); a `$(` never closed, a `$` before any
//!   other character, and a `$` at the very end are kept as written. [`expand`] leaves an
//!   unknown variable as `$(VAR)`, as `MappingFuncFor` does for `command`, `args` and `env`.
//! - `pkg/kubelet/container/helpers.go` `ExpandContainerVolumeMounts`: a `subPathExpr` is
//!   expanded with the container's environment, and a variable that is unknown *or empty* is an
//!   error naming every such variable, sorted: `missing value for A, B` ([`expand_sub_path_expr`]).
//! - `pkg/kubelet/kubelet_pods.go` `makeMounts`: an absolute sub-path is refused
//!   (``error SubPath `/x` must not be an absolute path``), then one with a `..` element
//!   (``unable to provision SubPath `a/../b`: must not contain '..'``), the elements being what
//!   `/` separates (so `..baz` and `.baz` are fine) ([`validate_sub_path`]).
//!
//! One difference on purpose: Go copies a non-ASCII byte after a lone `$` as if it were a rune
//! of its own (`"$é"` comes out as invalid UTF-8); kvol keeps the character whole.

/// `input` with every `$(NAME)` replaced by `env(NAME)`; a name `env` does not know stays as
/// written (`$(NAME)`). `$$` is a literal `$`; see the module for the rest of the rules.
pub fn expand(input: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    expand_with(input, &mut |name| env(name).unwrap_or_else(|| format!("$({name})")))
}

/// A container's `subPathExpr` expanded as kubelet expands it: every variable must be set and
/// non-empty in `env`, else the error names each one that is not (sorted, each once).
pub fn expand_sub_path_expr(expr: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut missing = std::collections::BTreeSet::new();
    let expanded = expand_with(expr, &mut |name| match env(name) {
        Some(value) if !value.is_empty() => value,
        _ => {
            missing.insert(name.to_string());
            String::new()
        }
    });
    if missing.is_empty() {
        Ok(expanded)
    } else {
        Err(format!("missing value for {}", missing.into_iter().collect::<Vec<_>>().join(", ")))
    }
}

/// Upstream's `Expand`: `mapping` answers every `$(NAME)` met.
fn expand_with(input: &str, mapping: &mut dyn FnMut(&str) -> String) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    // Everything before `checkpoint` is in `out` already.
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            // How many bytes after the `$` were consumed.
            let consumed = match bytes[cursor + 1] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest[1..].find(')') {
                    Some(close) => {
                        out.push_str(&mapping(&rest[1..1 + close]));
                        close + 2
                    }
                    // Incomplete: the `$(` is kept and scanning goes on after it.
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                // Not an expression: the `$` is kept, the next character copied as it is.
                _ => {
                    out.push('$');
                    0
                }
            };
            cursor += consumed;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.push_str(&input[checkpoint..]);
    out
}

/// Whether kubelet takes `path` as a sub-path: relative, and no `/`-separated element is `..`.
/// The errors are kubelet's (`makeMounts`), in the order it checks.
pub fn validate_sub_path(path: &str) -> Result<(), String> {
    if path.starts_with('/') {
        return Err(format!("error SubPath `{path}` must not be an absolute path"));
    }
    if path.split('/').any(|element| element == "..") {
        return Err(format!("unable to provision SubPath `{path}`: must not contain '..'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn lookup(vars: &BTreeMap<&str, &str>) -> impl Fn(&str) -> Option<String> {
        move |name| vars.get(name).map(|v| v.to_string())
    }

    /// Upstream's `doExpansionTest` table (expand_test.go), with its context.
    #[test]
    fn upstream_expansion_table() {
        let vars = BTreeMap::from([
            ("VAR_A", "A"),
            ("VAR_B", "B"),
            ("VAR_C", "C"),
            ("VAR_REF", "$(VAR_A)"),
            ("VAR_EMPTY", ""),
        ]);
        let env = lookup(&vars);
        // (name, input, expected)
        let cases: &[(&str, &str, &str)] = &[
            ("whole string", "$(VAR_A)", "A"),
            ("repeat", "$(VAR_A)-$(VAR_A)", "A-A"),
            ("beginning", "$(VAR_A)-1", "A-1"),
            ("middle", "___$(VAR_B)___", "___B___"),
            ("end", "___$(VAR_C)", "___C"),
            ("compound", "$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
            ("escape & expand", "$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
            ("compound escape", "$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"),
            ("mixed in escapes", "f000-$$VAR_A", "f000-$VAR_A"),
            ("backslash escape ignored", "foo\\$(VAR_C)bar", "foo\\Cbar"),
            ("backslash escape ignored", "foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
            ("lots of backslashes", "foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"),
            ("nested var references", "$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
            ("nested var references second type", "$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),
            ("value is a reference", "$(VAR_REF)", "$(VAR_A)"),
            ("value is a reference x 2", "%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"),
            ("empty var", "foo$(VAR_EMPTY)bar", "foobar"),
            ("unterminated expression", "foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"),
            ("expression without operator", "f00__(VAR_A)__", "f00__(VAR_A)__"),
            ("shell special vars pass through", "$?_boo_$!", "$?_boo_$!"),
            ("bare operators are ignored", "$VAR_A", "$VAR_A"),
            ("undefined vars are passed through", "$(VAR_DNE)", "$(VAR_DNE)"),
            ("multiple (even) operators, var undefined", "$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
            ("multiple (even) operators, var defined", "$$$$$$(VAR_A)", "$$$(VAR_A)"),
            ("multiple (odd) operators, var undefined", "$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"),
            ("multiple (odd) operators, var defined", "$$$$$$$(VAR_A)", "$$$A"),
            ("missing open expression", "$VAR_A)", "$VAR_A)"),
            ("shell syntax ignored", "${VAR_A}", "${VAR_A}"),
            ("trailing incomplete expression not consumed", "$(VAR_B)_______$(A", "B_______$(A"),
            (
                "trailing incomplete expression, no content, is not consumed",
                "$(VAR_C)_______$(",
                "C_______$(",
            ),
            ("operator at end of input string is preserved", "$(VAR_A)foobarzab$", "Afoobarzab$"),
            ("shell escaped incomplete expr", "foo-\\$(VAR_A", "foo-\\$(VAR_A"),
            ("lots of $( in middle", "--$($($($($--", "--$($($($($--"),
            ("lots of $( in beginning", "$($($($($--foo$(", "$($($($($--foo$("),
            ("lots of $( at end", "foo0--$($($($(", "foo0--$($($($("),
            ("escaped operators in variable names are not escaped", "$(foo$$var)", "$(foo$$var)"),
            ("newline not expanded", "\n", "\n"),
            // kvol's own, beside upstream's.
            ("empty input", "", ""),
            ("lone operator", "$", "$"),
            ("escaped operator alone", "$$", "$"),
            ("non-ASCII after a lone operator kept whole", "$é$(VAR_A)ü", "$éAü"),
            ("non-ASCII value and name", "$(VAR_A)/ö/$(ö)", "A/ö/$(ö)"),
        ];
        for (name, input, want) in cases {
            assert_eq!(expand(input, &env), *want, "{name}: {input:?}");
        }
    }

    /// Upstream's `TestMapReference`: each variable expanded with those declared before it.
    #[test]
    fn upstream_sequential_references() {
        let declared = [("FOO", "bar"), ("ZOO", "$(FOO)-1"), ("BLU", "$(ZOO)-2")];
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in declared {
            let expanded = expand(value, &|n: &str| env.get(n).cloned());
            env.insert(name.to_string(), expanded);
        }
        let want = BTreeMap::from([("FOO", "bar"), ("ZOO", "bar-1"), ("BLU", "bar-1-2")]);
        let got: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, want);
    }

    /// Upstream's `TestExpandVolumeMountsWithSubpath` (helpers_test.go): `Ok` is the sub-path,
    /// `Err` the message (upstream only checks that there is one; the text is kubelet's).
    #[test]
    fn upstream_sub_path_expr_table() {
        // (name, expression, environment, expected)
        type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], Result<&'a str, &'a str>);
        let cases: &[Case] = &[
            ("subpath with no expansion", "foo", &[], Ok("foo")),
            ("volumes with expanded subpath", "foo/$(POD_NAME)", &[("POD_NAME", "bar")], Ok("foo/bar")),
            ("volumes expanded with empty subpath", "", &[("POD_NAME", "bar")], Ok("")),
            (
                "volumes expanded with no envs subpath",
                "/foo/$(POD_NAME)",
                &[],
                Err("missing value for POD_NAME"),
            ),
            (
                "volumes expanded with leading environment variable",
                "$(POD_NAME)/bar",
                &[("POD_NAME", "foo")],
                Ok("foo/bar"),
            ),
            (
                "subpaths with empty environment variable",
                "foo/$(POD_NAME)/$(ANNOTATION)",
                &[("ANNOTATION", "")],
                Err("missing value for ANNOTATION, POD_NAME"),
            ),
            (
                "subpaths with missing env variables",
                "foo/$(ODD_NAME)/$(POD_NAME)",
                &[("ODD_NAME", "bar")],
                Err("missing value for POD_NAME"),
            ),
            ("subpaths with empty expansion", "$()", &[], Err("missing value for ")),
            (
                "subpaths with nested expandable envs",
                "$(POD_NAME$(ANNOTATION))",
                &[("POD_NAME", "foo"), ("ANNOTATION", "bar")],
                Err("missing value for POD_NAME$(ANNOTATION"),
            ),
            // kvol's own: escapes still work, and each missing name is named once.
            ("escaped reference", "$$(POD_NAME)/x", &[], Ok("$(POD_NAME)/x")),
            ("repeated missing name", "$(A)/$(A)", &[], Err("missing value for A")),
        ];
        for (name, expr, vars, want) in cases {
            let vars: BTreeMap<&str, &str> = vars.iter().copied().collect();
            let got = expand_sub_path_expr(expr, &lookup(&vars));
            assert_eq!(got.as_deref().map_err(String::as_str), *want, "{name}: {expr:?}");
        }
    }

    /// Upstream's facts: `TestMakeMounts` (kubelet_pods_test.go) for kubelet's messages,
    /// `TestValidateVolumeMounts` (validation_test.go) and `TestValidatePathNoBacksteps`
    /// (pv_validation_test.go) for which paths pass.
    #[test]
    fn sub_paths_kubelet_accepts() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "/must/not/be/absolute",
                Some("error SubPath `/must/not/be/absolute` must not be an absolute path"),
            ),
            (
                "no/backsteps/../allowed",
                Some("unable to provision SubPath `no/backsteps/../allowed`: must not contain '..'"),
            ),
            ("baz", None),
            (".baz", None),
            ("..baz", None),
            ("a/b/c", None),
            ("a/./b", None),
            ("a//b/", None),
            (".", None),
            ("/baz", Some("error SubPath `/baz` must not be an absolute path")),
            ("../baz", Some("unable to provision SubPath `../baz`: must not contain '..'")),
            ("baz/../bat", Some("unable to provision SubPath `baz/../bat`: must not contain '..'")),
            ("./..", Some("unable to provision SubPath `./..`: must not contain '..'")),
            ("..", Some("unable to provision SubPath `..`: must not contain '..'")),
            ("foo/bar/..", Some("unable to provision SubPath `foo/bar/..`: must not contain '..'")),
            // Absolute is checked first, as kubelet does.
            ("/foo/bar/..", Some("error SubPath `/foo/bar/..` must not be an absolute path")),
        ];
        for (path, want) in cases {
            assert_eq!(validate_sub_path(path).err().as_deref(), *want, "{path:?}");
        }
    }
}
