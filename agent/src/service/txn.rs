//! One guarded mutation of a volume: lock, load the mark, admit the token,
//! do the work, commit the mark (or put back what was on disk).
//!
//! Every mutating operation runs through [`Agent::detached`] and
//! [`Agent::begin`]. The operation runs in a task of its own, so a client that
//! times out or drops its connection cannot cancel it halfway: the task keeps
//! the volume's lock until the mark is written, and the next request for the
//! volume sees the outcome.
use super::Agent;
use crate::{
    error::AgentError,
    fence::{Admission, Call, Token},
    marks::{FenceMark, MarkStore},
    volume::VolumeId,
};
use std::{future::Future, sync::Arc};
use tokio::sync::OwnedMutexGuard;

/// An admitted request holding its volume's lock.
pub(crate) struct Txn {
    /// The volume.
    pub id: VolumeId,
    /// The mark to commit: as loaded, with the fence advanced by the admission.
    pub mark: FenceMark,
    /// The mark as it is on disk now (`None`: no file).
    pub on_disk: Option<FenceMark>,
    /// How the token was admitted.
    pub admission: Admission,
    marks: MarkStore,
    _guard: OwnedMutexGuard<()>,
}

/// Runs synchronous work (a backend, an exporter, the mark store) on a
/// blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(work).await?
}

impl Agent {
    /// Runs `operation` to its end in a task of its own, whatever happens to
    /// the caller's future (see the module doc).
    pub(crate) async fn detached<T, F, Fut>(self: &Arc<Self>, operation: F) -> Result<T, AgentError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Agent>) -> Fut,
        Fut: Future<Output = Result<T, AgentError>> + Send + 'static,
    {
        tokio::spawn(operation(self.clone())).await?
    }

    /// Takes the volume's lock, loads its mark and admits the token. A
    /// refusal changes nothing.
    pub(crate) async fn begin(
        &self,
        id: &VolumeId,
        token: Option<&Token>,
        call: Call,
    ) -> Result<Txn, AgentError> {
        let guard = self.locks.lock(id.as_str()).await;
        let (marks, key) = (self.marks.clone(), id.as_str().to_owned());
        let on_disk = blocking(move || Ok(marks.load(&key)?)).await?;
        let mut mark = on_disk
            .clone()
            .unwrap_or_else(|| FenceMark::new(id.as_str()));
        let (fence, admission) = mark.fence.admit(id.as_str(), token, call)?;
        mark.fence = fence;
        Ok(Txn {
            id: id.clone(),
            mark,
            on_disk,
            admission,
            marks: self.marks.clone(),
            _guard: guard,
        })
    }
}

impl Agent {
    /// Takes the volume's lock and loads its mark without a token: for work
    /// that changes no lifecycle ([`Admission::Unfenced`]).
    pub(crate) async fn hold(&self, id: &VolumeId) -> Result<Txn, AgentError> {
        let guard = self.locks.lock(id.as_str()).await;
        let (marks, key) = (self.marks.clone(), id.as_str().to_owned());
        let on_disk = blocking(move || Ok(marks.load(&key)?)).await?;
        Ok(Txn {
            id: id.clone(),
            mark: on_disk
                .clone()
                .unwrap_or_else(|| FenceMark::new(id.as_str())),
            on_disk,
            admission: Admission::Unfenced,
            marks: self.marks.clone(),
            _guard: guard,
        })
    }
}

impl Txn {
    /// Writes `self.mark` durably and keeps holding the lock (an intent
    /// recorded before the work it announces).
    pub async fn save(&mut self) -> Result<(), AgentError> {
        let (marks, mark) = (self.marks.clone(), self.mark.clone());
        blocking(move || Ok(marks.save(&mark)?)).await?;
        self.on_disk = Some(self.mark.clone());
        crate::crash::point("mark-intent-saved");
        Ok(())
    }

    /// Writes `self.mark` durably and releases the lock.
    pub async fn commit(self) -> Result<(), AgentError> {
        let (marks, mark) = (self.marks.clone(), self.mark.clone());
        blocking(move || Ok(marks.save(&mark)?)).await?;
        crate::crash::point("mark-committed");
        Ok(())
    }

    /// Writes `self.mark` and releases the lock; `Some(why)` when the new
    /// mark was renamed into place but not made durable (the outcome is
    /// unknown; nothing is rolled back).
    pub async fn commit_reporting(self) -> Result<Option<String>, AgentError> {
        let (marks, mark) = (self.marks.clone(), self.mark.clone());
        let outcome = blocking(move || match marks.save(&mark) {
            Ok(()) => Ok(None),
            Err(e @ crate::marks::MarkError::Unsynced { .. }) => Ok(Some(e.to_string())),
            Err(e) => Err(e.into()),
        })
        .await?;
        crate::crash::point("mark-committed");
        Ok(outcome)
    }

    /// Puts `before` back on disk (`None`: removes the file) and releases
    /// the lock: the undo of an intent whose work did not happen.
    pub async fn restore(self, before: Option<FenceMark>) -> Result<(), AgentError> {
        let (marks, key) = (self.marks.clone(), self.id.as_str().to_owned());
        blocking(move || {
            match before {
                Some(mark) => marks.save(&mark)?,
                None => marks.remove(&key)?,
            }
            Ok(())
        })
        .await?;
        crate::crash::point("mark-restored");
        Ok(())
    }
}
