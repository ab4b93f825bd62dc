"""djl_handlers.scheduling"""
