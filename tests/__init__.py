"""The test suite; its folders mirror the package's (wire/, lock/, asyncio/, tasks/, ...)."""
