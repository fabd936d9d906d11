//! Experiment parameters: named, typed, with defaults for quick and full mode
//! and a help line each; set from the command line as `--name=value` or
//! `--name value` (dashes and underscores are the same).

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A non-negative integer.
    Int,
    /// Comma-separated non-negative integers.
    IntList,
    /// Any text (a path).
    Text,
}

#[derive(Clone)]
pub struct Param {
    pub name: &'static str,
    pub kind: Kind,
    pub value: String,
    pub help: &'static str,
}

#[derive(Clone, Default)]
pub struct Params {
    pub items: Vec<Param>,
}

fn valid(kind: Kind, v: &str) -> bool {
    match kind {
        Kind::Int => v.parse::<u64>().is_ok(),
        Kind::IntList => !v.is_empty() && v.split(',').all(|x| x.trim().parse::<u64>().is_ok()),
        Kind::Text => !v.is_empty(),
    }
}

impl Params {
    pub fn def(mut self, name: &'static str, kind: Kind, value: impl ToString, help: &'static str) -> Params {
        self.items.push(Param { name, kind, value: value.to_string(), help });
        self
    }

    pub fn has(&self, name: &str) -> bool {
        let name = name.replace('-', "_");
        self.items.iter().any(|p| p.name == name)
    }

    /// Sets a parameter; an unknown name or an ill-typed value is an error.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let key = name.replace('-', "_");
        let p = self.items.iter_mut().find(|p| p.name == key).ok_or_else(|| format!("unknown parameter '--{name}'"))?;
        if !valid(p.kind, value) {
            let what = match p.kind {
                Kind::Int => "a non-negative integer",
                Kind::IntList => "a comma-separated list of integers",
                Kind::Text => "a non-empty value",
            };
            return Err(format!("--{name}: '{value}' is not {what}"));
        }
        p.value = value.to_string();
        Ok(())
    }

    fn get(&self, name: &str) -> &Param {
        self.items.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no parameter {name}"))
    }

    pub fn int(&self, name: &str) -> u64 {
        self.get(name).value.parse().expect("validated")
    }

    pub fn list(&self, name: &str) -> Vec<u64> {
        self.get(name).value.split(',').map(|x| x.trim().parse().expect("validated")).collect()
    }

    pub fn text(&self, name: &str) -> String {
        self.get(name).value.clone()
    }

    pub fn pairs(&self) -> Vec<(String, String)> {
        self.items.iter().map(|p| (p.name.to_string(), p.value.clone())).collect()
    }
}
