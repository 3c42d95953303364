"""How the API answers failures: each error type's status and body (Slurm's words for the
native API, a Status for kubectl)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy.orm.exc import StaleDataError

from shoal.server import jobs as jobsvc
from shoal.server.auth import AuthError
from shoal.server.kube.objects import ObjectError
from shoal.server.kubeapi.printing import status
from shoal.server.kubeapi.registry import is_kube_path
from shoal.server.retry import CONFLICT_MESSAGE


def install(app: FastAPI) -> None:
    """The app's exception handlers: Slurm's words for the native API, a Status for kubectl."""

    @app.exception_handler(AuthError)
    async def _auth_error(request, exc: AuthError):
        if is_kube_path(request.url.path):  # kubectl reads a Status
            reason = "Unauthorized" if exc.status == 401 else "Forbidden"
            return JSONResponse(status(exc.message, exc.status, reason), status_code=exc.status)
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(jobsvc.JobError)
    async def _job_error(request, exc: jobsvc.JobError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(ObjectError)
    async def _object_error(request, exc: ObjectError):
        return JSONResponse({"detail": exc.message, "reason": exc.reason}, status_code=exc.status)

    @app.exception_handler(StaleDataError)
    async def _conflict(request, exc: StaleDataError):
        # Optimistic concurrency: someone else changed the same row first. Safe to retry.
        if is_kube_path(request.url.path):
            return JSONResponse(status(CONFLICT_MESSAGE, 409, "Conflict"), status_code=409)
        return JSONResponse({"detail": CONFLICT_MESSAGE}, status_code=409)
