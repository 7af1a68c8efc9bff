"""backends/docker"""
