//! What a probe may make the agent keep of what it declares: Netdata's charts and
//! dimensions, the identifiers and names a stream's first values gather (collectd, ClassAd,
//! kv), the names outside `provides:` the log remembers. Each is kept for as long as the
//! probe (or its child) lives, and a probe that declares new ones for ever would grow the
//! agent without end; limits on counts multiply (10,000 charts x 1,000 dimensions is 10^7
//! entries, gigabytes). So every such entry is charged, in bytes, to ONE [`DeclaredBudget`]
//! per probe: its name's bytes plus [`ENTRY_OVERHEAD`]. Past the budget a new declaration is
//! dropped; what is already kept keeps working (a declared chart's values still flow), and the
//! owner says so once ([`DeclaredBudget::first_refusal`]).
//!
//! The agent's memory for declared state is then at most the sum of its probes' budgets,
//! [`DECLARED_STATE_BYTES`] each by default (docs/reliability.md states the bound with the
//! rest).

/// Bytes of declared state one probe may keep unless a stream's `declared_state:` says
/// otherwise (within `config::limits::DECLARED_STATE`). Netdata's larger external plugins (go.d with
/// many jobs, apps.plugin) declare a few thousand dimensions with names of tens of bytes:
/// about 200 bytes each with [`ENTRY_OVERHEAD`], so 2 MiB holds some 10,000 of them, several
/// times what such a plugin declares, while 64 stream probes stay within 128 MiB.
pub const DECLARED_STATE_BYTES: usize = 2 << 20;

/// What one kept entry costs beyond its name's bytes, honest about the containers: a hash
/// map slot (a `String` key of 24 bytes and a value of up to 48: a chart's own map), doubled
/// for the table's growth (a map is between half and 7/8 full), its control byte, and the
/// allocator's header and rounding of the name's heap block (16 to 32 bytes).
pub const ENTRY_OVERHEAD: usize = 2 * (24 + 48) + 1 + 32;

/// One probe's budget for declared state (see the module's text).
#[derive(Debug, Clone)]
pub struct DeclaredBudget {
    used: usize,
    limit: usize,
    entries: usize,
    /// Declarations dropped at the budget.
    refused: u64,
    /// Whether [`Self::first_refusal`] has already answered yes.
    said: bool,
}

impl Default for DeclaredBudget {
    fn default() -> Self {
        Self::new(DECLARED_STATE_BYTES)
    }
}

/// A charge past the budget: the entry is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetReached;

impl DeclaredBudget {
    pub fn new(limit: usize) -> Self {
        Self {
            used: 0,
            limit,
            entries: 0,
            refused: 0,
            said: false,
        }
    }

    /// What keeping an entry named `name` costs.
    pub fn cost(name: &str) -> usize {
        name.len().saturating_add(ENTRY_OVERHEAD)
    }

    /// Charge a new entry named `name`; `Err` (counted) when it would pass the budget: the
    /// caller does not keep it.
    pub fn charge(&mut self, name: &str) -> Result<(), BudgetReached> {
        self.charge_len(name.len())
    }

    /// [`Self::charge`] for an entry whose name and labels take `bytes` in all.
    pub fn charge_len(&mut self, bytes: usize) -> Result<(), BudgetReached> {
        let cost = bytes.saturating_add(ENTRY_OVERHEAD);
        match self.used.checked_add(cost).filter(|u| *u <= self.limit) {
            Some(used) => {
                self.used = used;
                self.entries += 1;
                Ok(())
            }
            None => {
                self.refused += 1;
                Err(BudgetReached)
            }
        }
    }

    /// Give back what `entries` entries of `bytes` cost in all (state that died with a
    /// stream's child).
    pub fn release(&mut self, bytes: usize, entries: usize) {
        self.used = self.used.saturating_sub(bytes);
        self.entries = self.entries.saturating_sub(entries);
    }

    pub fn used(&self) -> usize {
        self.used
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Declarations dropped at the budget so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Whether the budget has refused something: true the first time it is asked after a
    /// refusal, then never again, so its owner warns once.
    pub fn first_refusal(&mut self) -> bool {
        if self.refused > 0 && !self.said {
            self.said = true;
            return true;
        }
        false
    }

    /// The warning's text, with the figures.
    pub fn reached_text(&self) -> String {
        format!(
            "the probe reached its declared-state budget: {} entries take {} of {} bytes; new declarations (charts, dimensions, identifiers, names) are dropped ({} so far), those already kept keep their values flowing",
            self.entries, self.used, self.limit, self.refused
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stop_at_the_limit_and_are_counted() {
        let name = "d".repeat(100);
        let cost = DeclaredBudget::cost(&name);
        let mut b = DeclaredBudget::new(cost * 3 + cost / 2);
        for _ in 0..3 {
            assert_eq!(b.charge(&name), Ok(()));
        }
        assert!(!b.first_refusal(), "nothing refused yet");
        assert_eq!(b.charge(&name), Err(BudgetReached));
        assert_eq!(b.charge(&name), Err(BudgetReached));
        assert_eq!((b.used(), b.entries(), b.refused()), (cost * 3, 3, 2));
        assert!(b.first_refusal());
        assert!(!b.first_refusal(), "said once");
        assert!(
            b.reached_text().contains("3 entries"),
            "{}",
            b.reached_text()
        );
        b.release(cost * 2, 2);
        assert_eq!(b.charge(&name), Ok(()), "room given back");
        assert_eq!(b.entries(), 2);
    }

    #[test]
    fn a_huge_name_is_refused_without_overflow() {
        let mut b = DeclaredBudget::new(usize::MAX - 1);
        b.used = usize::MAX - 10;
        assert_eq!(b.charge("a name"), Err(BudgetReached));
    }
}
